"""The ``endpoint-runtime`` command: run an endpoint, send a message, manage queues and errors.

Example::

    endpoint-runtime run handlers_examples.sales:endpoint --max-concurrency 8
    endpoint-runtime send sales --type handlers_examples.messages:PlaceOrder \\
        --json '{"order_id": "1", "customer": "c", "product": "mouse", "quantity": 1,
                 "unit_price": "19.95"}'
    endpoint-runtime queues list
    endpoint-runtime queues peek sales
    endpoint-runtime errors list
    endpoint-runtime errors retry --all
    endpoint-runtime sagas show sales_OrderFulfilment --correlation 17
    endpoint-runtime db stop

Every command reads :class:`~endpoint_runtime.settings.TransportSettings` from the ``[transport]``
table of ``--config FILE`` (optional) and the ``ENDPOINT_RUNTIME_*`` environment, so
``ENDPOINT_RUNTIME_DSN`` picks the server; without one the user's embedded PostgreSQL is used
(the same one from every directory: :func:`endpoint_runtime.connections.embedded.data_dir`). Errors
of the runtime (:class:`~endpoint_runtime.errors.EndpointRuntimeError`) print one line on stderr
and exit with status 2.

One module per command: ``run``, ``send``, ``queues``, ``errors``, ``status``,
``subscriptions``, ``sagas``, ``ingest``, ``report``, ``console`` and ``database`` (``db``:
``db install``, ``db url``, ``db psql``, ``db stop``); each adds its subparser with
``add_parser`` and holds the coroutines that carry the command out. ``status_lines`` and
``common`` are shared by them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import asyncpg

from endpoint_runtime.cli import (
    console,
    database,
    errors,
    ingest,
    queues,
    report,
    run,
    sagas,
    send,
    status,
    subscriptions,
)
from endpoint_runtime.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, PROG, Command
from endpoint_runtime.errors import EndpointRuntimeError
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.settings import TransportSettings, load_settings

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run message endpoints on PostgreSQL queue tables and Ray, send messages, "
        "manage queues and the error queue.",
        epilog="Settings: [transport] table of --config, ENDPOINT_RUNTIME_* variables "
        "(ENDPOINT_RUNTIME_DSN picks the server; without one, the user's embedded PostgreSQL, "
        "in ENDPOINT_RUNTIME_DATA_DIR, else $XDG_DATA_HOME/endpoint-runtime, else "
        "~/.local/share/endpoint-runtime; /var/lib/endpoint-runtime for root).",
    )
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML settings file (its [transport] table is read)")
    # Also accepted after the subcommand; SUPPRESS keeps an earlier value from being reset.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML settings file (its [transport] table is read)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (run, ingest, send, queues, errors, subscriptions, sagas, status, report,
                   console, database):
        module.add_parser(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``endpoint-runtime`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    # Logs go to stderr; commands other than `run` show warnings only unless asked otherwise,
    # so that their standard output (message ids, queue lists) stays clean.
    configure_logging(
        os.environ.get("ENDPOINT_RUNTIME_LOG_LEVEL", getattr(args, "log_level", "warning"))
    )
    # Like `python -m`: modules of the current directory can be named (endpoints, types).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    command: Command = args.handler
    try:
        settings = load_settings(
            TransportSettings, path=Path(args.config) if args.config else None, table="transport"
        )
        return asyncio.run(command(args, settings))
    except EndpointRuntimeError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except asyncpg.PostgresError as exc:
        print(f"{PROG}: error: PostgreSQL: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
