"""The concurrency limit across receivers (also when changed at runtime) and scaling."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime

import pytest

from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.runtime.actors.deployment_status import DeploymentStatus
from endpoint_runtime.runtime.collector import YOUNG_THRESHOLD
from endpoint_runtime.runtime.deployment import EndpointDeployment
from tests.e2e.conftest import (
    Deployer,
    count,
    create_queues,
    fresh_status,
    send_batch,
    status_line,
    wait_for,
    wait_for_status,
)
from tests.e2e.endpoints import BUSY_HOLD, Busy, Timed

pytestmark = pytest.mark.ray

BACKLOG = 40
"""Slow messages (0.25 s each) for the scaling test: ~10 s for one receiver alone, so more
receivers have time to start (a few seconds on a small machine) and take part."""


def max_overlap(intervals: Iterable[tuple[datetime, datetime]]) -> int:
    """Most intervals open at one instant; an interval ending when another starts does not
    overlap it."""
    events = []
    for started, ended in intervals:
        assert started <= ended
        events += [(started, 1), (ended, -1)]
    events.sort(key=lambda event: (event[0], event[1]))  # ends before starts at a tie
    open_now = highest = 0
    for _, change in events:
        open_now += change
        highest = max(highest, open_now)
    return highest


async def _intervals(
    transport: PostgresTransport, batch: int
) -> list[tuple[datetime, datetime]]:
    rows = await transport.pool.fetch(
        "SELECT started, ended FROM intervals WHERE batch = $1", batch
    )
    return [(row["started"], row["ended"]) for row in rows]


async def _wait_handled(transport: PostgresTransport, batch: int, expected: int) -> None:
    async def handled() -> bool:
        done = await count(transport.pool, "SELECT count(*) FROM intervals WHERE batch = $1",
                           batch)
        return done >= expected

    await wait_for(handled, timeout=30, what=f"{expected} messages of batch {batch} handled")


async def start_with_backlog(deployer: Deployer, transport: PostgresTransport, messages: int,
                             slots_per_receiver: int) -> EndpointDeployment:
    """The intervals table, ``messages`` timed messages of batch 1, and the deployment
    (``max_concurrency=4``)."""
    await transport.pool.execute(
        "CREATE TABLE intervals (n int, batch int, started timestamptz, ended timestamptz, "
        "pid int)"
    )
    await create_queues(transport, "concurrency")
    await send_batch(transport, "concurrency", [Timed(n, batch=1) for n in range(messages)])
    return await deployer.start(
        "concurrency_endpoint", max_concurrency=4, slots_per_receiver=slots_per_receiver
    )


async def test_concurrency_limit_holds_across_receivers_and_follows_runtime_changes(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    """Each handler records [start, end] by the database clock; the recorded interval lies
    inside the time the message is in flight, so more overlapping intervals than the limit
    would prove the limit broken."""
    deployment = await start_with_backlog(deployer, transport, 60, slots_per_receiver=2)

    await _wait_handled(transport, batch=1, expected=60)
    first = await _intervals(transport, batch=1)
    assert len(first) == 60
    overlap = max_overlap(first)
    assert overlap <= 4, f"{overlap} messages in flight at once with max_concurrency=4"
    assert overlap >= 2, "the backlog was never handled concurrently: the test proves nothing"
    receivers = await transport.pool.fetchval("SELECT count(DISTINCT pid) FROM intervals")
    assert receivers == 2  # 4 slots, 2 per receiver
    # Ray runs its async actors on uvloop whenever it can be imported (a dependency).
    status = await fresh_status(deployment)
    loops = {r.event_loop for r in status.receivers}
    assert loops == {"uvloop.Loop"}, loops
    # And their collectors as runtime.collector sets them (Python's default young threshold
    # is 700).
    assert {r.collector_thresholds[0] for r in status.receivers} == {YOUNG_THRESHOLD}

    # Lower the limit while a batch is being handled: it holds once the call returns.
    await send_batch(transport, "concurrency", [Timed(n, batch=2) for n in range(60)])
    await _wait_handled(transport, batch=2, expected=4)
    await deployment.set_max_concurrency(1)
    changed_at: datetime = await transport.pool.fetchval("SELECT clock_timestamp()")
    status = await fresh_status(deployment)
    assert status.max_concurrency == 1
    assert sum(r.allowance for r in status.receivers) <= 1, status_line(status)
    await _wait_handled(transport, batch=2, expected=60)
    after_change = [(max(started, changed_at), ended)
                    for started, ended in await _intervals(transport, batch=2)
                    if ended > changed_at]
    assert len(after_change) >= 5, "the batch was over before the change: nothing to compare"
    assert max_overlap(after_change) <= 1

    # A batch sent after the change.
    await send_batch(transport, "concurrency", [Timed(n, batch=3) for n in range(15)])
    await _wait_handled(transport, batch=3, expected=15)
    third = await _intervals(transport, batch=3)
    assert min(started for started, _ in third) > changed_at
    assert max_overlap(third) <= 1


async def test_receivers_scale_up_with_a_backlog_and_back_down_when_idle(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    await transport.pool.execute(
        "CREATE TABLE business (n int, pid int, started timestamptz, ended timestamptz)"
    )
    deployment = await deployer.start(
        "scaling_endpoint",
        max_concurrency=4, slots_per_receiver=1, min_receivers=1, scale_down_after=1.0,
    )
    await wait_for_status(deployment, lambda s: len(s.receivers) == 1, timeout=10,
                          what="one receiver while idle (min_receivers=1)")
    seen: list[int] = []

    def receivers_above_one(status: DeploymentStatus) -> bool:
        seen.append(len(status.receivers))
        return seen[-1] > 1

    # The backlog's handlers wait on a lock the test holds until two receivers have each
    # taken a message: one receiver alone may otherwise finish it (10 s of work) before a
    # second has started on a loaded machine (a full suite's run once saw that).
    async with transport.pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", BUSY_HOLD)
        await send_batch(transport, "scaling", [Busy(n) for n in range(BACKLOG)])
        await wait_for_status(deployment, receivers_above_one, timeout=20,
                              what="more than one receiver for a backlog")
        await wait_for(lambda: _waiting_receivers(transport, at_least=2), timeout=30,
                       what="two receivers each holding a message of the backlog")
        await holder.execute("SELECT pg_advisory_unlock($1)", BUSY_HOLD)

    async def drained() -> bool:
        seen.append(len((await deployment.status()).receivers))
        return await count(transport.pool, "SELECT count(*) FROM business") == BACKLOG

    await wait_for(drained, timeout=30, what="the backlog handled")
    status = await wait_for_status(
        deployment, lambda s: len(s.receivers) == 1, timeout=15,
        what="back to one receiver after scale_down_after of idleness",
    )
    assert max(seen) <= 4, f"more receivers than max_concurrency / slots_per_receiver: {seen}"
    pids = await transport.pool.fetchval("SELECT count(DISTINCT pid) FROM business")
    assert pids > 1, "the backlog was handled by one receiver only"
    rows = await transport.pool.fetch("SELECT started, ended FROM business")
    assert max_overlap((row["started"], row["ended"]) for row in rows) <= 4  # while scaling
    assert await transport.depth("scaling") == 0
    assert status.estimate == 0


async def _waiting_receivers(transport: PostgresTransport, *, at_least: int) -> bool:
    """Whether ``at_least`` backends wait for :data:`BUSY_HOLD`: with one slot per receiver,
    as many receivers each hold a message."""
    waiting = await transport.pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 "
        "AND NOT granted AND database = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())", BUSY_HOLD)
    return int(waiting) >= at_least


async def test_status_requests_while_the_receivers_change_see_a_consistent_list(
    deployer: Deployer, transport: PostgresTransport
) -> None:
    """`receiver_pids` (and so `fresh_status`) asked the receivers while a change of the
    concurrency retired or started some: the answers no longer matched the list (`zip()
    argument 2 is longer than argument 1`, seen once in CI; not reproduced at will here). Asked
    under the peeker's lock now, over a snapshot of the list."""
    deployment = await start_with_backlog(deployer, transport, 400, slots_per_receiver=1)

    async def keep_asking() -> int:
        asked = 0
        for _ in range(30):
            pids = await deployment.receiver_pids()
            assert len(pids) == len(set(pids))
            asked += 1
        return asked

    async def keep_changing() -> None:
        for limit in (1, 4, 2, 4, 1, 3):
            await deployment.set_max_concurrency(limit)

    asked, _ = await asyncio.gather(keep_asking(), keep_changing())
    assert asked == 30
    status = await fresh_status(deployment)
    assert status.max_concurrency == 3, status_line(status)
    assert sum(r.allowance for r in status.receivers) <= 3, status_line(status)
