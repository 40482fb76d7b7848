"""Closing a pool when a connection never came back (real PostgreSQL)."""

from __future__ import annotations

import time

import asyncpg

from endpoint_runtime.connections.connecting import close_pool, connect_pool
from tests.e2e.conftest import wait_for


async def test_a_connection_never_returned_does_not_hold_the_close_forever(
    database_dsn: str,
) -> None:
    """A stopping receiver closed its pool with ``Pool.close``, which waits for every
    checked-out connection without a bound: one leaked by a failed cleanup held the
    deployment's stop forever (seen in the chaos run)."""
    pool = await connect_pool(database_dsn, min_size=1, max_size=2)
    leaked = await pool.acquire()
    await leaked.execute("BEGIN")
    backend = leaked.get_server_pid()

    started = time.monotonic()
    await close_pool(pool, timeout=0.5)

    assert time.monotonic() - started < 5.0
    assert pool.is_closing()
    admin = await asyncpg.connect(database_dsn)
    try:
        async def backend_gone() -> bool:
            return not await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend)

        await wait_for(backend_gone, timeout=10, what="the leaked connection's backend to end")
    finally:
        await admin.close()


async def test_a_pool_whose_connections_are_back_closes_gracefully(database_dsn: str) -> None:
    pool = await connect_pool(database_dsn, min_size=2, max_size=2)
    async with pool.acquire() as connection:
        await connection.execute("SELECT 1")

    await close_pool(pool, timeout=5.0)

    assert pool.is_closing()
    assert pool.get_size() == 0
