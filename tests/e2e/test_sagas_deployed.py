"""Sagas deployed (in process), several receivers competing on their own connections:
concurrent starters with one correlation value make one instance; concurrent updates of one
instance lose nothing (optimistic: conflicts retried; pessimistic: serialized by the row
lock, no conflict); a timeout requested before a restart fires after it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from endpoint_runtime import TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress
from tests.e2e.conftest import (
    Deployer,
    count,
    create_queues,
    fresh_status,
    send_batch,
    wait_for,
)
from tests.support.saga_endpoints import (
    HOLD_KEY,
    Add,
    Bump,
    Cancelled,
    OrderState,
    Placed,
    TallyState,
)

pytestmark = pytest.mark.in_process
MODULE = "tests.support.saga_endpoints"
RACERS = 8
WAITING_FOR_LOCK = """
    SELECT count(*) FROM pg_stat_activity
    WHERE wait_event_type = 'Lock' AND datname = current_database()"""
ENDPOINTS = {"optimistic": "fulfilment", "pessimistic": "fulfilment_pessimistic"}


@pytest.fixture
async def db(database_dsn: str) -> AsyncIterator[PostgresTransport]:
    async with PostgresTransport.connect(TransportSettings(dsn=database_dsn)) as transport:
        await create_queues(transport, "fulfilment", "shipments", "customers", "error")
        yield transport


async def held_race(db: PostgresTransport, messages: list[msgspec.Struct],
                    waiting: int) -> None:
    """Send ``messages`` while the test holds the lock their handlers wait on (between the
    saga's look-up and its save); release it once ``waiting`` sessions wait for a lock, so
    that those go on to their saves at the same moment."""
    async with db.pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", HOLD_KEY)
        await send_batch(db, "fulfilment", messages)
        await wait_for(lambda: _at_least(db, waiting), timeout=30,
                       what=f"{waiting} sessions waiting for a lock")
        await holder.execute("SELECT pg_advisory_unlock($1)", HOLD_KEY)


async def _at_least(db: PostgresTransport, waiting: int) -> bool:
    return await count(db.pool, WAITING_FOR_LOCK) >= waiting


@pytest.mark.parametrize("concurrency", ENDPOINTS)
async def test_concurrent_starters_with_one_value_make_one_instance(
    db: PostgresTransport, deployer: Deployer, concurrency: str,
) -> None:
    deployment = await deployer.start(ENDPOINTS[concurrency], module=MODULE, min_receivers=4)
    table = QueueAddress("fulfilment_Tally")
    await held_race(db, [Add("k", n, hold=True) for n in range(RACERS)], waiting=4)

    async def all_added() -> bool:
        data = await db.pool.fetchval(f'SELECT "Data"::text FROM {table.qualified}')
        return data is not None and len(msgspec.json.decode(data, type=TallyState).seen) == RACERS

    await wait_for(all_added, timeout=60, what=f"{RACERS} additions to the one instance")
    (row,) = await db.pool.fetch(f'SELECT "Data"::text AS data, "Concurrency" FROM '
                                 f"{table.qualified}")
    assert sorted(msgspec.json.decode(row["data"], type=TallyState).seen) == list(range(RACERS))
    assert row["Concurrency"] == RACERS
    status = await fresh_status(deployment)
    assert status.failed >= 1  # the losers of the race on the correlation index, retried
    assert await db.depth("error") == 0


@pytest.mark.parametrize("concurrency", ENDPOINTS)
async def test_concurrent_updates_of_one_instance_lose_nothing(
    db: PostgresTransport, deployer: Deployer, concurrency: str,
) -> None:
    deployment = await deployer.start(ENDPOINTS[concurrency], module=MODULE, min_receivers=4)
    table = QueueAddress("fulfilment_OrderSaga")
    await send_batch(db, "fulfilment", [Placed("o-1")])
    await wait_for(lambda: count(db.pool, f"SELECT count(*) FROM {table.qualified}"),
                   timeout=30, what="the instance")
    # optimistic: all read the same version, then race to save; pessimistic: one holds the
    # row lock (and waits on the test's lock), the others wait for the row
    await held_race(db, [Bump("o-1", hold=True) for _ in range(RACERS)], waiting=4)

    async def bumped() -> OrderState | None:
        data = await db.pool.fetchval(f'SELECT "Data"::text FROM {table.qualified}')
        state = msgspec.json.decode(data, type=OrderState)
        return state if state.bumps == RACERS else None

    await wait_for(bumped, timeout=60, what=f"{RACERS} bumps")
    status = await fresh_status(deployment)
    if concurrency == "optimistic":
        assert status.failed >= 1  # version conflicts, each retried
    else:
        assert status.failed == 0  # the row lock serialized them: no conflict at all
    assert await count(db.pool, f'SELECT "Concurrency" FROM {table.qualified}') == RACERS + 1
    assert await db.depth("error") == 0


async def test_a_timeout_requested_before_a_restart_fires_after_it(
    db: PostgresTransport, deployer: Deployer,
) -> None:
    # 8 s: the first deployment must be stopped before the timeout is due (its mover would
    # deliver it), with room for a slow start and stop on a loaded machine.
    first = await deployer.start("fulfilment", module=MODULE)
    table = QueueAddress("fulfilment_OrderSaga")
    await send_batch(db, "fulfilment", [Placed("o-9", timeout_s=8)])
    await wait_for(lambda: count(db.pool, f"SELECT count(*) FROM {table.qualified}"),
                   timeout=30, what="the instance")
    await deployer.stop(first)
    assert await count(db.pool, 'SELECT count(*) FROM "fulfilment.delayed"') == 1
    assert await db.depth("shipments") == 0

    await deployer.start("fulfilment", module=MODULE)

    async def cancelled() -> list[Cancelled]:
        rows = await db.pool.fetch('SELECT body FROM "shipments"')
        return [msgspec.json.decode(r["body"], type=Cancelled) for r in rows]

    assert await wait_for(cancelled, timeout=60, what="the timeout") == [Cancelled("o-9")]
    await wait_for(lambda: _gone(db, table), timeout=10, what="the completed instance gone")


async def _gone(db: PostgresTransport, table: QueueAddress) -> bool:
    return await count(db.pool, f"SELECT count(*) FROM {table.qualified}") == 0
