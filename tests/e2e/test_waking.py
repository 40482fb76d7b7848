"""Waking an endpoint: min_receivers=0 on demand, LISTEN reconnection through the peeker and
a receiver; throttling to one message at a time. Endpoints in
``tests/support/waking_endpoints.py``."""

from __future__ import annotations

from collections.abc import Awaitable

import msgspec
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.transport.waiting import Waiting
from endpoint_runtime.wire.messages import TransportMessage
from tests.e2e.conftest import Deployer, count, drain_queue, wait_for, wait_for_status
from tests.support.notifications import Heard
from tests.support.waking_endpoints import HOLD, Flaky, Ping, Report

pytestmark = pytest.mark.in_process
MODULE = "tests.support.waking_endpoints"
LONG_PEEK_DELAY = 60.0
"""A periodic peek that never comes during a test: only a NOTIFY can wake the deployment."""


@pytest.fixture
def db(with_handled: PostgresTransport) -> PostgresTransport:
    return with_handled


async def _handled(db: PostgresTransport, key: str) -> bool:
    return await count(db.pool, "SELECT count(*) FROM handled WHERE key = $1", key) == 1


async def test_min_receivers_zero_starts_a_receiver_for_a_message_and_retires_it(
    db: PostgresTransport, deployer: Deployer
) -> None:
    """No receiver while idle; a message sent wakes the deployment, a receiver handles it,
    and the deployment goes back to none (scaling down takes peek cycles: 1 s apart here)."""
    deployment = await deployer.start("on_demand", module=MODULE, peek_delay=1.0)
    assert (await deployment.status()).receivers == []
    for key in ("first", "second"):
        await db.send("on_demand", create_outgoing(Ping(key)))
        await wait_for(lambda key=key: _handled(db, key), timeout=30, what=f"{key!r} handled")
        await wait_for_status(deployment, lambda s: s.receivers == [], timeout=30,
                              what="the deployment back to no receivers")
    assert await count(db.pool, "SELECT count(*) FROM handled") == 2


async def _listening_backends(db: PostgresTransport) -> set[int]:
    rows = await db.pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()")
    return {row["pid"] for row in rows}


# The minute-long peek delay is the point (only a NOTIFY can wake the deployment in time).
@pytest.mark.filterwarnings("ignore:peek_delay .* is above the recommended:UserWarning")
@pytest.mark.parametrize(("endpoint", "listeners"), [("on_demand", 1), ("kept", 2)],
                         ids=["peeker", "peeker-and-receiver"])
async def test_lost_listen_connections_come_back_and_wake_the_deployment(
    db: PostgresTransport, deployer: Deployer, endpoint: str, listeners: int
) -> None:
    """The LISTEN connections of the peeker (and of the receiver kept by min_receivers=1)
    are terminated, as on a server restart: new ones take their place, and a message sent
    afterwards is handled on their NOTIFY (the periodic peek is a minute away)."""
    await deployer.start(endpoint, module=MODULE, peek_delay=LONG_PEEK_DELAY)
    old = await wait_for(
        lambda: _at_least(db, listeners), timeout=30, what=f"{listeners} LISTEN connections")
    await db.pool.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid",
                          list(old))

    async def replaced() -> set[int] | None:
        now = await _listening_backends(db)
        return now if len(now) == listeners and not now & old else None

    await wait_for(replaced, timeout=30, what="new LISTEN connections")
    await db.send(endpoint, create_outgoing(Ping("after")))
    await wait_for(lambda: _handled(db, "after"), timeout=30,
                   what="the message sent after the reconnection, handled")


async def _at_least(db: PostgresTransport, listeners: int) -> set[int] | None:
    now = await _listening_backends(db)
    return now if len(now) >= listeners else None


# The minute-long peek delay is the point (only a NOTIFY or the mark can wake the deployment).
@pytest.mark.filterwarnings("ignore:peek_delay .* is above the recommended:UserWarning")
async def test_a_busy_queue_sends_no_notify_and_its_endpoint_is_woken_again_once_idle(
    db: PostgresTransport, deployer: Deployer
) -> None:
    """Sends NOTIFY only while the queue's channel is marked waiting (transport.waiting): the
    idle endpoint marks it, its peeker clears it once it sees messages queued (its handlers
    wait on a lock the test holds), a send then notifies nobody; once the backlog is done the
    last receive slot marks it again, and a message sent then is handled at once (the
    periodic peek is a minute away)."""
    waiting = Waiting(QueueAddress("held"))
    channel = QueueAddress("held").notify_channel
    await deployer.start("held", module=MODULE, peek_delay=LONG_PEEK_DELAY)
    await wait_for(lambda: waiting.is_waiting(db.pool), timeout=30, what="the idle mark")
    async with (db.pool.acquire() as listening,
                Heard(channel).listening(listening) as notifications):
        await _busy_then_idle(db, waiting, notifications)


async def _busy_then_idle(db: PostgresTransport, waiting: Waiting,
                          notifications: Heard) -> None:
    await db.send("held", create_outgoing(Ping("idle")))
    await wait_for(lambda: _handled(db, "idle"), timeout=30, what="'idle' handled")
    assert await notifications.before_marker(db.pool, "after idle") == [""]

    async with db.pool.acquire() as holding:
        await holding.execute("SELECT pg_advisory_lock($1)", HOLD)
        await db.send_many("held", [create_outgoing(Ping(f"backlog {n}"))
                                    for n in range(8)])
        await wait_for(lambda: _not(waiting.is_waiting(db.pool)), timeout=30,
                       what="the mark cleared by the peeker, messages queued")
        assert await notifications.before_marker(db.pool, "after backlog") == [""]
        await db.send("held", create_outgoing(Ping("busy")))
        assert await notifications.before_marker(db.pool, "after busy") == []
        await holding.execute("SELECT pg_advisory_unlock($1)", HOLD)

    await wait_for(lambda: _all_handled(db, 10), timeout=30, what="the backlog handled")
    await wait_for(lambda: waiting.is_waiting(db.pool), timeout=30,
                   what="the mark made again by the idle receiver")
    await db.send("held", create_outgoing(Ping("idle again")))
    await wait_for(lambda: _handled(db, "idle again"), timeout=30,
                   what="'idle again' handled on its NOTIFY")
    assert await notifications.before_marker(db.pool, "after idle again") == [""]


async def _all_handled(db: PostgresTransport, expected: int) -> bool:
    return await count(db.pool, "SELECT count(*) FROM handled") == expected


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


async def test_throttling_runs_one_message_at_a_time(
    db: PostgresTransport, deployer: Deployer
) -> None:
    """Up to four handlers run at once until two failures in a row throttle the receiver;
    from then on (the runs already in flight aside) one runs at a time."""
    await db.create_queue("reports")
    await deployer.start("throttled", module=MODULE)
    await db.send_many("throttled", [create_outgoing(Flaky(n)) for n in range(12)])
    reports: list[Report] = []

    async def enough_throttled_runs() -> bool:
        for message in await drain_queue(db, "reports"):
            assert isinstance(message, TransportMessage)
            reports.append(msgspec.json.decode(message.body, type=Report))
        return sum(r.throttled for r in reports) >= 10

    await wait_for(enough_throttled_runs, timeout=60, what="ten runs while throttled")
    assert max(r.concurrent for r in reports if not r.throttled) > 1  # before: concurrent
    assert [r.concurrent_since_throttled for r in reports if r.throttled] == [1] * len(
        [r for r in reports if r.throttled]), reports
