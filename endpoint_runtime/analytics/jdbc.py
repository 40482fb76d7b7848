"""A libpq DSN (URL, keyword list, or ``""`` for the ``PG*`` variables) as a JDBC URL and
connection properties, so that Spark reads the server every other command talks to.

A host that is a directory is a Unix socket: the JDBC driver reaches it through junixsocket's
socket factory (the embedded server listens on a socket only). The password travels as a
property, never in the URL, and the ``repr`` hides it.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from endpoint_runtime.errors import ConfigurationError

DEFAULT_PORT = "5432"
SOCKET_DIRS = ("/run/postgresql", "/var/run/postgresql", "/tmp")
SOCKET_FACTORY = "org.newsclub.net.unix.AFUNIXSocketFactory$FactoryArg"
SSL_MODES = frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"})
_ENVIRONMENT = {"host": "PGHOST", "port": "PGPORT", "dbname": "PGDATABASE", "user": "PGUSER",
                "password": "PGPASSWORD", "sslmode": "PGSSLMODE"}
_KEYWORD = re.compile(r"\s*(\w+)\s*=\s*('(?:\\.|[^\\'])*'|\S*)")


@dataclass(frozen=True)
class JdbcTarget:
    """Where Spark's JDBC reads go: ``url`` plus ``properties`` (user, password, ...)."""

    url: str
    properties: dict[str, str] = field(repr=False)
    unix_socket: bool = False

    def __repr__(self) -> str:
        shown = {k: ("***" if k == "password" else v) for k, v in self.properties.items()}
        return f"JdbcTarget(url={self.url!r}, properties={shown!r})"


def parse_dsn(dsn: str) -> dict[str, str]:
    """The DSN's settings (``host``, ``port``, ``dbname``, ``user``, ``password``,
    ``sslmode``, ...), filled from the ``PG*`` variables where the DSN is silent."""
    settings: dict[str, str] = {}
    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigurationError(f"not a PostgreSQL DSN (scheme {parts.scheme!r})")
        netloc = parts.netloc.rpartition("@")[2]
        if parts.username:
            settings["user"] = unquote(parts.username)
        if parts.password:
            settings["password"] = unquote(parts.password)
        if netloc:
            hosts, ports = [], []
            for address in netloc.split(","):
                if address.startswith("["):  # [IPv6]:port
                    host, _, rest = address[1:].partition("]")
                    port = rest.removeprefix(":")
                else:
                    host, _, port = address.partition(":")
                hosts.append(unquote(host))
                ports.append(port)
            settings["host"] = ",".join(hosts)
            if any(ports):
                settings["port"] = ",".join(port or DEFAULT_PORT for port in ports)
        if parts.path.strip("/"):
            settings["dbname"] = unquote(parts.path.lstrip("/"))
        settings.update({key: value for key, value in parse_qsl(parts.query) if value})
    else:
        for match in _KEYWORD.finditer(dsn):
            value = match[2]
            if value.startswith("'"):
                value = re.sub(r"\\(.)", r"\1", value[1:-1] if value.endswith("'") else value[1:])
            settings[match[1]] = value
    for key, variable in _ENVIRONMENT.items():
        if key not in settings and os.environ.get(variable):
            settings[key] = os.environ[variable]
    return settings


def jdbc_target(dsn: str) -> JdbcTarget:
    """The JDBC URL and properties of ``dsn`` (see :func:`parse_dsn`)."""
    settings = parse_dsn(dsn)
    user = settings.get("user") or getpass.getuser()
    database = settings.get("dbname") or user
    port = settings.get("port") or DEFAULT_PORT
    host = settings.get("host") or _default_host(port)
    properties = {"user": user, "ApplicationName": "endpoint-runtime report"}
    if settings.get("password"):
        properties["password"] = settings["password"]
    sslmode = settings.get("sslmode")
    if sslmode in SSL_MODES:
        properties["sslmode"] = sslmode
    path = "/" + _encode(database)
    if host.startswith("/"):
        socket = str(Path(host.split(",")[0]) / f".s.PGSQL.{port.split(',')[0]}")
        properties["socketFactory"] = SOCKET_FACTORY
        properties["socketFactoryArg"] = socket
        properties["sslmode"] = "disable"
        return JdbcTarget(url=f"jdbc:postgresql://localhost{path}", properties=properties,
                          unix_socket=True)
    hosts = host.split(",")
    ports = port.split(",")
    addresses = ",".join(
        f"{_bracket(name)}:{ports[i] if i < len(ports) else ports[-1]}"
        for i, name in enumerate(hosts))
    return JdbcTarget(url=f"jdbc:postgresql://{addresses}{path}", properties=properties)


def _default_host(port: str) -> str:
    """libpq's default: the first socket directory that has the server's socket."""
    for directory in SOCKET_DIRS:
        if Path(directory, f".s.PGSQL.{port}").exists():
            return directory
    return "localhost"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _encode(text: str) -> str:
    return "".join(char if char.isalnum() or char in "-._~" else
                   "".join(f"%{byte:02X}" for byte in char.encode()) for char in text)
