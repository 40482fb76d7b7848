"""``endpoint-runtime console``: the operator's web console (failed messages, endpoints,
conversations), served by uvicorn on 127.0.0.1 unless told otherwise.

Every request needs the token printed at start (or given with ``--token`` or
``ENDPOINT_RUNTIME_CONSOLE_TOKEN``); ``--read-only`` refuses every action. Needs the
``console`` extra. See docs/console.md.

Example::

    endpoint-runtime console
    endpoint-runtime console --port 8470 --read-only
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from endpoint_runtime.cli.common import EXIT_OK, positive_int
from endpoint_runtime.settings import TransportSettings

DEFAULT_PORT = 8470
TOKEN_VARIABLE = "ENDPOINT_RUNTIME_CONSOLE_TOKEN"


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    console = commands.add_parser(
        "console", parents=[common], help="the operator's web console",
        description="Serve the web console: failed messages grouped by exception (retry, "
        "archive, restore), endpoints, message search and conversations.",
    )
    console.add_argument("--host", default="127.0.0.1",
                         help="address to bind (default 127.0.0.1: this machine only)")
    console.add_argument("--port", type=positive_int, default=DEFAULT_PORT,
                         help=f"port (default {DEFAULT_PORT})")
    console.add_argument("--token", default=None,
                         help=f"the access token (default: ${TOKEN_VARIABLE}, else a new one, "
                         "printed)")
    console.add_argument("--error-queue", default="error", metavar="QUEUE",
                         help="the error queue (default error)")
    console.add_argument("--report", type=Path, default=None, metavar="DIR",
                         help="serve the Spark report written to DIR (`report --out DIR`)")
    console.add_argument("--read-only", action="store_true",
                         help="show everything, change nothing")
    console.set_defaults(handler=console_command)


async def console_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    # Imported here: the console's libraries are an extra the other commands do not need.
    import uvicorn

    from endpoint_runtime.console import create_app
    from endpoint_runtime.console.security import new_token

    class AnnouncingServer(uvicorn.Server):
        """Prints the console's address once it accepts connections: a first start of the
        embedded PostgreSQL takes a while, and an address printed before that was refused."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"console: http://{args.host}:{args.port}/?token={token}", flush=True)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn stops gracefully on Ctrl-C or SIGTERM, then raises the signal again for
            # its caller: here that ended the command with a traceback and "interrupted".
            # For a server that signal is its normal end: the command exits 0.
            with super().capture_signals():
                yield
                captured = getattr(self, "_captured_signals", None)
                if captured:
                    captured.clear()

    token = args.token or os.environ.get(TOKEN_VARIABLE) or new_token()
    app = create_app(settings, token, error_queue=args.error_queue, read_only=args.read_only,
                     report=args.report)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    await AnnouncingServer(config).serve()
    return EXIT_OK
