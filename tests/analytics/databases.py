"""A database of a module's own, for runs that several of its tests share (they only read
what the runs wrote)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.transport import quote_identifier


async def _admin(server_dsn: str, statement: str) -> None:
    connection = await asyncpg.connect(with_database(server_dsn, "postgres"))
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@contextmanager
def own_database(server_dsn: str, label: str) -> Iterator[str]:
    """The DSN of a new, empty database ``er_<label>_<pid>``, dropped on exit."""
    name = quote_identifier(f"er_{label}_{os.getpid()}")
    asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {name}"))
    asyncio.run(_admin(server_dsn, f"CREATE DATABASE {name}"))
    try:
        yield with_database(server_dsn, name.strip('"'))
    finally:
        asyncio.run(_admin(server_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
