"""Closing a pool when a connection never came back (real PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg

from endpoint_runtime.connections.connecting import (
    POOL_CLOSE_TIMEOUT,
    PostgresTransport,
    close_pool,
    connect_pool,
)
from endpoint_runtime.settings import TransportSettings
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


async def test_a_transport_closes_while_one_of_its_connections_waits_on_a_lock(
    database_dsn: str,
) -> None:
    """``PostgresTransport.close`` (and leaving ``async with PostgresTransport.connect``) used
    ``Pool.close``: a connection of its pool still waiting on a lock (a test cut short by its
    timeout, a cancelled caller) held the close forever."""
    holder = await asyncpg.connect(database_dsn)
    await holder.execute("CREATE TABLE locked (n int)")
    await holder.execute("BEGIN; LOCK TABLE locked IN ACCESS EXCLUSIVE MODE")
    try:
        transport = await PostgresTransport.connect(TransportSettings(dsn=database_dsn))
        waiting = await transport.pool.acquire()
        blocked = asyncio.get_running_loop().create_task(
            waiting.fetchval("SELECT count(*) FROM locked"))

        async def waits_on_the_lock() -> bool:
            return bool(await holder.fetchval(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                "'locked'::regclass"))

        await wait_for(waits_on_the_lock, timeout=10, what="the pool's query to wait on the lock")

        started = time.monotonic()
        await asyncio.wait_for(transport.close(), POOL_CLOSE_TIMEOUT + 10)

        assert time.monotonic() - started < POOL_CLOSE_TIMEOUT + 5
        assert transport.pool.is_closing()
        with contextlib.suppress(Exception):
            await blocked
    finally:
        await holder.close()
