"""A PostgreSQL server of the tests' own over TCP, as users connect.

The e2e tests run against one (:func:`start`, from ``tests/e2e/conftest.py``: a server per
worker); the other folders use the embedded server's Unix socket. It is started from the
``pgserver`` wheel's binaries in a temporary directory, listening on 127.0.0.1 at a free port
(``benchmarks.chaos.server``, which also handles root), with ``max_connections`` as the
embedded server has it.

Run as a module, it runs any command against such a server (``ENDPOINT_RUNTIME_DSN`` names
it), removes the server and exits with the command's status; when the server cannot start,
it says why and exits with :data:`EXIT_NO_SERVER` without running the command::

    python -m tests.support.tcp_server -- python -m pytest -q tests/integration
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
        server = start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"tcp_server: could not start a PostgreSQL server: {exc}", file=sys.stderr)
        return EXIT_NO_SERVER
    try:
        print(f"tcp_server: PostgreSQL at {server.dsn} (max_connections "
              f"{EMBEDDED_MAX_CONNECTIONS})", file=sys.stderr, flush=True)
        return subprocess.call(command, env={**os.environ, "ENDPOINT_RUNTIME_DSN": server.dsn})
    finally:
        server.destroy()


def start() -> ChaosServer:
    """A server on a free 127.0.0.1 port with the embedded server's ``max_connections``;
    the caller destroys it. Raises when it cannot start (what failed, and the server's log)."""
    server = ChaosServer.create(port=free_port())
    try:
        asyncio.run(_raise_max_connections(server.dsn))
        server.restart()
    except BaseException:
        server.destroy()
        raise
    return server


async def _raise_max_connections(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            f"ALTER SYSTEM SET max_connections = {EMBEDDED_MAX_CONNECTIONS}")
    finally:
        await connection.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
