"""Where the PostgreSQL server comes from, and the embedded one when none is given.

Order: an explicit DSN (setting), ``ENDPOINT_RUNTIME_DSN``, libpq ``PG*`` variables, else an
embedded PostgreSQL (the ``pgserver`` wheel) in the ``pgdata`` directory of the data directory
(:func:`locate_data_dir`): one per user, whatever directory a command runs in, so that every
command of a user reaches the same database. The embedded server keeps running after the
process ends so the next command reuses it; the process that starts it says so once on stderr;
``endpoint-runtime db stop`` stops it.

As root, PostgreSQL runs as the wheel's ``pgserver`` system user (``initdb`` refuses root),
which must be able to enter the data directory: root's default is therefore outside its home
(``/var/lib/endpoint-runtime``). The wheel opens (``chmod o+rx``) every directory above the data
directory and its own binaries that this user could not enter (``/root``, mode 0700, for a
data directory or a virtualenv in root's home); a warning names such a directory first.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import stat
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit, urlunsplit

import structlog

from endpoint_runtime.errors import DatabaseUnavailableError

# Importable from here as they always were (the DSN's redaction lives with the settings).
from endpoint_runtime.redaction import RedactedDsn as RedactedDsn
from endpoint_runtime.redaction import redact_dsn as redact_dsn

log = structlog.get_logger(__name__)

LIBPQ_VARIABLES = ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGSERVICE")
EMBEDDED_MAX_CONNECTIONS = 400
DATA_DIR_VARIABLE = "ENDPOINT_RUNTIME_DATA_DIR"
DATA_DIR_NAME = "endpoint-runtime"
ROOT_DATA_DIR = Path("/var/lib") / DATA_DIR_NAME
"""Root's default: its home is closed to the ``pgserver`` user the server runs as."""

def locate_data_dir(environ: Mapping[str, str], *, uid: int, home: Path) -> Path:
    """Where the embedded server's files live (its ``pgdata`` below), by these rules:

    1. ``ENDPOINT_RUNTIME_DATA_DIR`` when set (a relative path is taken from the current
       directory by :func:`data_dir`);
    2. ``$XDG_DATA_HOME/endpoint-runtime`` when ``XDG_DATA_HOME`` is an absolute path;
    3. root (``uid`` 0): ``/var/lib/endpoint-runtime``, which the ``pgserver`` user can enter;
    4. anyone else: ``~/.local/share/endpoint-runtime`` (``home`` is ``~``).

    Pure: the environment, the user id and the home directory are given.

    Example::

        locate_data_dir({}, uid=1000, home=Path("/home/ada"))
        # PosixPath('/home/ada/.local/share/endpoint-runtime')
    """
    chosen = environ.get(DATA_DIR_VARIABLE)
    if chosen:
        return Path(chosen)
    xdg_data_home = environ.get("XDG_DATA_HOME")
    if xdg_data_home and Path(xdg_data_home).is_absolute():
        return Path(xdg_data_home) / DATA_DIR_NAME
    if uid == 0:
        return ROOT_DATA_DIR
    return home / ".local" / "share" / DATA_DIR_NAME


def data_dir() -> Path:
    """This process's data directory (:func:`locate_data_dir`), as an absolute path."""
    return locate_data_dir(os.environ, uid=os.geteuid(), home=Path.home()).resolve()


def closed_directory_above(path: Path) -> Path | None:
    """The first existing directory above ``path`` that other users cannot enter (no ``o+x``),
    or ``None``: as root, the server's own user must pass through each of them."""
    for parent in reversed(path.parents):
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            return None  # what does not exist yet is made by us, open (_make_directories)
        if not mode & stat.S_IXOTH:
            return parent
    return None


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
    as_root = os.geteuid() == 0
    pgserver = import_pgserver()  # imported late: only needed when no server is given
    if as_root:
        _warn_of_opened_directories(pgdata, Path(str(pgserver.__file__)).parent / "pginstall")
    try:
        _make_directories(pgdata.parent, open_to_others=as_root)
        with _starting(pgdata.parent):
            was_running = _postmaster_running(pgdata)
            server = pgserver.get_server(pgdata, cleanup_mode=None)
            _ensure_capacity(server, pgdata)
    except Exception as exc:
        raise DatabaseUnavailableError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}; "
            "set ENDPOINT_RUNTIME_DSN to use a server of your own"
        ) from exc
    uri: str = server.get_uri()
    if not was_running:
        _announce_start(pgdata)
    log.info("embedded_postgres", data_dir=str(pgdata), dsn=redact_dsn(uri))
    return uri


def import_pgserver() -> ModuleType:
    """The ``pgserver`` module, imported without platformdirs' warning that
    ``XDG_RUNTIME_DIR`` is unset (it is, outside a login session: containers, cron, CI); the
    wheel then keeps its lock file in ``/tmp/runtime-<uid>``, as with the variable set so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import pgserver
    return pgserver


def _warn_of_opened_directories(pgdata: Path, installation: Path) -> None:
    """As root, the wheel lets its ``pgserver`` user reach the data directory and its own
    binaries by adding ``o+rx`` to every directory above them (``/root`` included, when the
    data directory or the virtualenv is in root's home): say so before it does."""
    for path, what in ((pgdata, "data directory"), (installation, "server binaries")):
        closed = closed_directory_above(path)
        if closed is not None:
            log.warning("embedded_postgres_opens_directory", directory=str(closed),
                        reason=f"the server runs as the 'pgserver' user, which must reach its "
                        f"{what} ({path}); the pgserver wheel makes {closed} enterable and "
                        "readable by every user",
                        hint=f"keep the data directory out of closed directories (root's "
                        f"default is {ROOT_DATA_DIR}) or set ENDPOINT_RUNTIME_DSN")


def _make_directories(directory: Path, *, open_to_others: bool) -> None:
    """Create ``directory`` and the missing ones above it; as root, each one it creates is
    made enterable by the server's own user (``0755``, whatever the umask)."""
    for path in reversed([directory, *directory.parents]):
        if path.exists():
            continue
        path.mkdir(exist_ok=True)
        if open_to_others:
            path.chmod(0o755)


@contextlib.contextmanager
def _starting(directory: Path) -> Iterator[None]:
    """One process at a time starts the server and raises its capacity: a second command
    started meanwhile (``run``, then ``ingest``) would otherwise connect to a server the first
    is restarting, and fail."""
    with (directory / "start.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _postmaster_running(pgdata: Path) -> bool:
    """Whether ``pgdata``'s ``postmaster.pid`` names a live process."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    return True


def _announce_start(pgdata: Path) -> None:
    """Say once, on stderr, that this process started a server that outlives it."""
    with contextlib.suppress(ValueError, OSError):  # closed or broken stream
        print(f"endpoint-runtime: started the embedded PostgreSQL in {pgdata}; it keeps "
              "running for later commands (endpoint-runtime db stop stops it)",
              file=sys.stderr, flush=True)


def stop_embedded(directory: Path | None = None) -> bool:
    """Stop the embedded server if it runs; returns whether one was running."""
    import_pgserver()
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
