"""Run a command against a PostgreSQL server of its own, over TCP: CI's second pass.

Example::

    python -m tests.support.tcp_server -- python -m pytest -q tests/e2e

Users connect over TCP; the default test run uses the embedded server's Unix socket. This
starts a server from the ``pgserver`` wheel's binaries in a temporary directory, listening on
127.0.0.1 at a free port (``benchmarks.chaos.server``, which also handles root), with
``max_connections`` as the embedded server has it, runs the command with
``ENDPOINT_RUNTIME_DSN`` naming that server, removes the server and exits with the command's
status. When the server cannot start, it says why and exits with :data:`EXIT_NO_SERVER`
without running the command.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import asyncpg

from benchmarks.chaos.server import ChaosServer
from endpoint_runtime.connections.embedded import EMBEDDED_MAX_CONNECTIONS
from tests.cluster.nodes import free_port

EXIT_NO_SERVER = 3


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m tests.support.tcp_server -- COMMAND...", file=sys.stderr)
        return 2
    try:
        server = ChaosServer.create(port=free_port())
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"tcp_server: could not start a PostgreSQL server: {exc}", file=sys.stderr)
        return EXIT_NO_SERVER
    try:
        asyncio.run(_raise_max_connections(server.dsn))
        server.restart()
        print(f"tcp_server: PostgreSQL at {server.dsn} (max_connections "
              f"{EMBEDDED_MAX_CONNECTIONS})", file=sys.stderr, flush=True)
        return subprocess.call(command, env={**os.environ, "ENDPOINT_RUNTIME_DSN": server.dsn})
    finally:
        server.destroy()


async def _raise_max_connections(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            f"ALTER SYSTEM SET max_connections = {EMBEDDED_MAX_CONNECTIONS}")
    finally:
        await connection.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
