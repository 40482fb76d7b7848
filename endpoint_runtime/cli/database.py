"""``endpoint-runtime db url|psql|stop``: reach and stop the server the commands use.

``db url`` prints the DSN (password redacted unless ``--show-password``), ``db psql`` opens psql
on it (the embedded server's own psql when none is on ``PATH``), ``db stop`` stops the embedded
PostgreSQL (it outlives each run; one per user, see
:func:`endpoint_runtime.connections.embedded.data_dir`).
``db install`` and ``db grants`` are in
:mod:`endpoint_runtime.cli.installation`.

Example::

    endpoint-runtime db url
    endpoint-runtime db psql -- -c 'SELECT count(*) FROM orders'
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from endpoint_runtime.cli import installation
from endpoint_runtime.cli.common import EXIT_ERROR, EXIT_OK
from endpoint_runtime.errors import EndpointRuntimeError
from endpoint_runtime.settings import TransportSettings


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    db = commands.add_parser("db", parents=[common], help="the embedded PostgreSQL")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    stop = db_commands.add_parser(
        "stop", parents=[common], help="stop the embedded server (it outlives each run)"
    )
    stop.set_defaults(handler=db_stop)
    url = db_commands.add_parser(
        "url", parents=[common], help="print the DSN the commands use (password redacted)"
    )
    url.add_argument("--show-password", action="store_true",
                     help="print the password too (for a script that connects with it)")
    url.set_defaults(handler=db_url)
    psql = db_commands.add_parser(
        "psql", parents=[common], help="open psql on the server the commands use"
    )
    psql.add_argument("psql_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                      help="arguments passed on to psql, after --")
    psql.set_defaults(handler=db_psql)
    installation.add_parsers(db_commands, common)


async def db_stop(args: argparse.Namespace, settings: TransportSettings) -> int:
    from endpoint_runtime.connections.embedded import data_dir, stop_embedded

    directory = data_dir()
    try:
        stopped = await asyncio.to_thread(stop_embedded)
    except Exception as exc:  # pg_ctl failures come as CalledProcessError and friends
        raise EndpointRuntimeError(
            f"could not stop the embedded PostgreSQL in {directory / 'pgdata'}: {exc}"
        ) from exc
    if stopped:
        print(f"stopped the embedded PostgreSQL in {directory / 'pgdata'}")
    else:
        print(f"no embedded PostgreSQL is running in {directory / 'pgdata'}")
    if settings.dsn or os.environ.get("ENDPOINT_RUNTIME_DSN"):
        print("note: a DSN is configured; that server is not managed by this command")
    return EXIT_OK


def _dsn(settings: TransportSettings) -> str:
    """The DSN of the server the commands use: the configured one, else the embedded one
    (started when it does not run yet). ``""`` means libpq's ``PG*`` variables."""
    from endpoint_runtime.connections.embedded import resolve_dsn

    return resolve_dsn(settings.dsn)


async def db_url(args: argparse.Namespace, settings: TransportSettings) -> int:
    from endpoint_runtime.connections.embedded import redact_dsn

    dsn = await asyncio.to_thread(_dsn, settings)
    if not dsn:
        print("(libpq's PG* environment variables: "
              + " ".join(f"{name}={os.environ[name]}" for name in _libpq_shown()) + ")")
        return EXIT_OK
    print(dsn if args.show_password else redact_dsn(dsn))
    return EXIT_OK


def _libpq_shown() -> list[str]:
    from endpoint_runtime.connections.embedded import LIBPQ_VARIABLES

    return [name for name in LIBPQ_VARIABLES if name != "PGPASSWORD" and os.environ.get(name)]


async def db_psql(args: argparse.Namespace, settings: TransportSettings) -> int:
    dsn = await asyncio.to_thread(_dsn, settings)
    psql = psql_binary()
    if psql is None:
        print("endpoint-runtime: error: no psql found (install PostgreSQL's client, e.g. "
              "apt-get install postgresql-client)", file=sys.stderr)
        return EXIT_ERROR
    extra = [arg for arg in args.psql_args if arg != "--"] if args.psql_args else []
    command = [str(psql), *([dsn] if dsn else []), *extra]
    sys.stdout.flush()
    os.execv(command[0], command)  # psql takes over the terminal; nothing runs after this


def psql_binary() -> Path | None:
    """psql on ``PATH``, else the one shipped with the embedded server's wheel."""
    found = shutil.which("psql")
    if found:
        return Path(found)
    from endpoint_runtime.connections.embedded import import_pgserver

    try:
        pgserver = import_pgserver()
    except ImportError:
        return None
    if pgserver.__file__ is None:
        return None
    shipped = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"
    return shipped if shipped.exists() else None
