"""``endpoint-runtime db stop``: stop the embedded PostgreSQL (it outlives each run); ``db install``
and ``db grants`` are in :mod:`endpoint_runtime.cli.installation`."""

from __future__ import annotations

import argparse
import asyncio
import os

from endpoint_runtime.cli import installation
from endpoint_runtime.cli.common import EXIT_OK
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
    installation.add_parsers(db_commands, common)


async def db_stop(args: argparse.Namespace, settings: TransportSettings) -> int:
    from endpoint_runtime.embedded import data_dir, stop_embedded

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
