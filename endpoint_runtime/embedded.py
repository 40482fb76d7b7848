"""Where the PostgreSQL server comes from, and the embedded one when none is given.

Order: an explicit DSN (setting), ``ENDPOINT_RUNTIME_DSN``, libpq ``PG*`` variables, else an
embedded PostgreSQL (the ``pgserver`` wheel) in ``ENDPOINT_RUNTIME_DATA_DIR`` (default
``.endpoint_runtime/pgdata`` under the current directory). The embedded server keeps running
after the process ends so the next run reuses it; ``endpoint-runtime db stop`` stops it.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import structlog

from endpoint_runtime.errors import DatabaseUnavailableError

log = structlog.get_logger(__name__)

LIBPQ_VARIABLES = ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGSERVICE")
EMBEDDED_MAX_CONNECTIONS = 400

# A keyword DSN's settings: key = value, the value bare or in single quotes (in which \\ escapes
# the next character; an unterminated quote runs to the end).
_KEYWORD_SETTING = re.compile(r"(?P<key>[A-Za-z_]\w*)(?P<equals>\s*=\s*)"
                              r"(?P<value>'(?:\\.|[^\\'])*(?:'|\\?$)|[^\s']\S*|)")
_SECRET_KEYS = frozenset({"password", "sslpassword"})
REDACTED = "***"


def redact_dsn(dsn: str) -> str:
    """The DSN with every password replaced by ``***``: the URL's user info, ``password=`` in
    its query string, and keyword settings, quoted values (spaces, escaped quotes) included.
    Also fit for error messages that quote a DSN."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.password is not None:
            user = parts.username or ""
            host = parts.netloc.rpartition("@")[2]
            parts = parts._replace(netloc=f"{user}:{REDACTED}@{host}")
        query = "&".join(
            f"{pair.partition('=')[0]}={REDACTED}" if _is_secret(pair.partition("=")[0]) else pair
            for pair in parts.query.split("&")
        )
        return urlunsplit(parts._replace(query=query))
    return _KEYWORD_SETTING.sub(
        lambda m: f"{m['key']}{m['equals']}{REDACTED}" if _is_secret(m["key"]) else m[0], dsn
    )


def _is_secret(key: str) -> bool:
    return unquote(key).strip().lower() in _SECRET_KEYS


class RedactedDsn(str):
    """A DSN whose ``repr`` hides its password: in a config struct's repr, a traceback, a
    log line or a Ray actor's error, only ``***`` shows (``str()`` is the DSN itself, which
    the driver needs)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(redact_dsn(str(self)))


def data_dir() -> Path:
    return Path(os.environ.get("ENDPOINT_RUNTIME_DATA_DIR", ".endpoint_runtime")).resolve()


def resolve_dsn(dsn: str | None = None) -> str:
    """The DSN to connect with: the argument, the environment, or an embedded server.

    Returns ``""`` when libpq ``PG*`` variables are to be used (asyncpg reads them itself).
    """
    if dsn:
        return dsn
    from_env = os.environ.get("ENDPOINT_RUNTIME_DSN")
    if from_env:
        return from_env
    if any(os.environ.get(name) for name in LIBPQ_VARIABLES):
        return ""
    return start_embedded()


def start_embedded(directory: Path | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL and return its DSN (a Unix socket)."""
    return _start_embedded((directory or data_dir()) / "pgdata")


@functools.cache
def _start_embedded(pgdata: Path) -> str:
    """Once per process and data directory; the server itself outlives the process."""
    import pgserver  # imported late: only needed when no server is given

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
        _ensure_capacity(server, pgdata)
    except Exception as exc:
        raise DatabaseUnavailableError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}; "
            "set ENDPOINT_RUNTIME_DSN to use a server of your own"
        ) from exc
    uri: str = server.get_uri()
    log.info("embedded_postgres", data_dir=str(pgdata), dsn=redact_dsn(uri))
    return uri


def stop_embedded(directory: Path | None = None) -> bool:
    """Stop the embedded server if it runs; returns whether one was running."""
    from pgserver import _commands

    pgdata = (directory or data_dir()) / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        return False
    user = "pgserver" if os.geteuid() == 0 else None
    _commands.pg_ctl(["-w", "stop", "-m", "fast"], pgdata=pgdata, user=user)  # type: ignore[attr-defined]
    return True


def _ensure_capacity(server: object, pgdata: Path) -> None:
    """Raise max_connections once: Ray receivers each hold a pool of their own."""
    psql = server.psql  # type: ignore[attr-defined]
    output: str = psql("SHOW max_connections;")
    numbers = [int(token) for token in output.split() if token.isdigit()]
    if numbers and numbers[0] >= EMBEDDED_MAX_CONNECTIONS:
        return
    psql(f"ALTER SYSTEM SET max_connections = {EMBEDDED_MAX_CONNECTIONS};")
    from pgserver import _commands

    user = "pgserver" if os.geteuid() == 0 else None
    try:
        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "restart", "-m", "fast"], pgdata=pgdata, user=user
        )
    except subprocess.CalledProcessError as exc:
        raise DatabaseUnavailableError(f"restart of embedded PostgreSQL failed: {exc}") from exc


def with_database(dsn: str, database: str) -> str:
    """The same server, another database (URL, keyword or empty libpq-environment DSN)."""
    if not dsn:
        return f"postgresql:///{database}"
    if "://" in dsn:
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path="/" + database))
    kept = re.sub(r"\bdbname\s*=\s*\S+", "", dsn).strip()
    return f"{kept} dbname={database}"
