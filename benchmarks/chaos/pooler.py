"""A PgBouncer of the run's own in front of a PostgreSQL server, as production puts one.

Debian's ``pgbouncer`` package (1.18: no protocol-level prepared statements), installed by
``bin/dev`` as the report's Java is, run from a temporary directory that holds its
configuration: transaction pooling by default, ``default_pool_size`` server connections per
database, every client logged in as the server's user (``auth_type = any``, the user and
password written in the ``[databases]`` entry, so no password file is needed), listening on
127.0.0.1 at a free port. As root it runs as the ``pgserver`` system user (PgBouncer refuses
root), which the embedded server and the chaos run's server also run as; its log goes to a
file of the caller's, so that user writes nothing.

Example::

    pooler = Pooler.start(server_dsn, pool_size=12)
    dsn = pooler.dsn("orders")        # a database of that server, through the pooler
    pooler.restart()                  # every client connection is cut
    pooler.stop()

With ``application_name_add_host`` each client's ``application_name`` gets `` - host:port``
(the client's end of its connection to the pooler) appended, which the server sees in every
transaction the pooler runs for that client: the chaos run traces a receive to the client
connection a fault cut that way. ``server_login_retry`` is 1 s (PgBouncer's default, 15 s,
keeps every client waiting that long after a failed login while the server restarts).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import psutil
from pgserver.utils import ensure_user_exists

from benchmarks.chaos.server import SYSTEM_USER

PGBOUNCER = "pgbouncer"
START_TIMEOUT_SECONDS = 10.0
ADDED_HOST = re.compile(r" - [^ ]*:(\d+)$")
"""What ``application_name_add_host`` appends: `` - <client host>:<client port>``."""


def available() -> str | None:
    """The ``pgbouncer`` program's path, or ``None`` (``bin/dev`` installs Debian's)."""
    return shutil.which(PGBOUNCER) or next(
        (str(p) for p in (Path("/usr/sbin/pgbouncer"), Path("/usr/bin/pgbouncer"))
         if p.exists()), None)


class Pooler:
    """One PgBouncer process and its directory."""

    def __init__(self, server_dsn: str, directory: Path, port: int, *, pool_size: int,
                 pool_mode: str, max_client_conn: int, server_user: str | None = None,
                 application_name_add_host: bool = False) -> None:
        self.server_dsn = server_dsn
        self.application_name_add_host = application_name_add_host
        self.directory = directory
        self.port = port
        self.pool_size = pool_size
        self.pool_mode = pool_mode
        self.max_client_conn = max_client_conn
        self.log_path = directory / "pgbouncer.log"
        self._process: subprocess.Popen[bytes] | None = None
        parts = urlsplit(server_dsn)
        self.user = unquote(parts.username or "postgres")
        self.server_user = server_user or self.user
        """The role its server connections log in as (a role of their own tells them apart
        in ``pg_stat_activity``); clients log in as :attr:`user` either way."""

    @classmethod
    def start(cls, server_dsn: str, *, pool_size: int = 12, pool_mode: str = "transaction",
              max_client_conn: int = 2000, port: int | None = None,
              server_user: str | None = None,
              application_name_add_host: bool = False) -> Pooler:
        """A running pooler in front of ``server_dsn`` (a URL DSN, TCP or a Unix socket's
        ``?host=/dir``), its server connections logged in as ``server_user`` (default: the
        DSN's user, whose password it uses); raises ``RuntimeError`` with its log when it
        does not come up."""
        program = available()
        if program is None:
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer; "
                               "bin/dev installs it)")
        directory = Path(tempfile.mkdtemp(prefix="endpoint-runtime-pgbouncer-"))
        directory.chmod(0o755)
        pooler = cls(server_dsn, directory, port or _free_port(), pool_size=pool_size,
                     pool_mode=pool_mode, max_client_conn=max_client_conn,
                     server_user=server_user,
                     application_name_add_host=application_name_add_host)
        pooler._write_config()
        try:
            pooler._launch(program)
        except BaseException:
            pooler.stop()
            raise
        return pooler

    def dsn(self, database: str = "postgres") -> str:
        """A client DSN of ``database`` through the pooler."""
        return f"postgresql://{quote(self.user, safe='')}@127.0.0.1:{self.port}/{database}"

    def for_dsn(self, server_dsn: str) -> str:
        """``server_dsn``'s database through the pooler."""
        database = unquote(urlsplit(server_dsn).path.lstrip("/")) or "postgres"
        return self.dsn(database)

    def restart(self) -> None:
        """Kill the process (every client and server connection is cut) and start it again
        on the same port."""
        self._terminate()
        program = available()
        assert program is not None
        self._launch(program)

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def pid(self) -> int:
        assert self._process is not None, "not running"
        return self._process.pid

    @property
    def server_port(self) -> int | None:
        """The server's TCP port; ``None`` for a server reached on a Unix socket."""
        parts = urlsplit(self.server_dsn)
        host = dict(pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair).get(
            "host") or parts.hostname or ""
        if unquote(host).startswith("/"):
            return None
        return parts.port or 5432

    def client_ports(self) -> list[int]:
        """The ports of its clients' ends of their connections now (observed on its process)."""
        return sorted(c.raddr.port for c in psutil.Process(self.pid).net_connections(kind="tcp")
                      if c.raddr and c.laddr.port == self.port)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _terminate(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None

    def _launch(self, program: str) -> None:
        command = [program]
        if os.geteuid() == 0:
            ensure_user_exists(SYSTEM_USER)
            command += ["-u", SYSTEM_USER]
        command.append(str(self.directory / "pgbouncer.ini"))
        log = self.log_path.open("ab")
        try:
            self._process = subprocess.Popen(command, stdout=log, stderr=log,
                                             stdin=subprocess.DEVNULL)
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not start on port {self.port}: "
                           f"{self.log_path.read_text(errors='replace')[-2000:]}")

    def _write_config(self) -> None:
        parts = urlsplit(self.server_dsn)
        query = dict(pair.split("=", 1) for pair in parts.query.split("&") if "=" in pair)
        host = unquote(query.get("host") or parts.hostname or "127.0.0.1")
        port = parts.port or int(query.get("port", "5432"))
        login = f"user={_value(self.server_user)}"
        if parts.password and self.server_user == self.user:
            login += f" password={_value(unquote(parts.password))}"
        (self.directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={_value(host)} port={port} {login}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            f"max_client_conn = {self.max_client_conn}\n"
            f"max_db_connections = {self.pool_size}\n"
            f"admin_users = {self.user}\n"
            "ignore_startup_parameters = extra_float_digits\n"
            "server_reset_query =\n"
            "server_login_retry = 1\n"
            f"application_name_add_host = {int(self.application_name_add_host)}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        (self.directory / "pgbouncer.ini").chmod(0o644)


def client_port_of(application_name: str) -> int | None:
    """The client port that ``application_name_add_host`` appended, if it did."""
    added = ADDED_HOST.search(application_name)
    return int(added.group(1)) if added else None


def _value(text: str) -> str:
    """A value of a PgBouncer connection string, quoted when it needs to be."""
    if text and all(c.isalnum() or c in "/._-" for c in text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
