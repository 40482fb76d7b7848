"""Delayed delivery against a real PostgreSQL: the store protocol, the mover, deferral rules."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec
import pytest

from endpoint_runtime import ConfigurationError, Endpoint, Sender, TransportSettings
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.circuit_breakers import BreakerState
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.delayed import DelayedMessage, PostgresDelayedMessageStore
from endpoint_runtime.delayed.mover import DelayedMessageMover, DispatchObserver
from endpoint_runtime.delayed.store import DelayedMessageStore
from endpoint_runtime.settings import DelayedDeliverySettings
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import TransportMessage
from tests.support.arrivals import arrivals, assert_on_time, record_arrivals


class Reminder(msgspec.Struct):
    text: str


def delayed(due: datetime, destination: str = "target") -> DelayedMessage:
    return DelayedMessage(id=uuid.uuid4(), destination=destination, due=due,
                          headers='{"NServiceBus.MessageId":"x"}', body=b"{}")


@pytest.fixture
async def store(transport: PostgresTransport) -> PostgresDelayedMessageStore:
    store = PostgresDelayedMessageStore.for_endpoint(QueueAddress("orders"))
    async with transport.pool.acquire() as connection:
        await store.setup_infrastructure(connection)
        await store.setup_infrastructure(connection)  # idempotent
    await transport.create_queue("target")
    await transport.create_queue("error")
    return store


@contextlib.asynccontextmanager
async def running_mover(
    transport: PostgresTransport, store: DelayedMessageStore, error_queue: str = "error",
    critical: list[str] | None = None, on_dispatched: DispatchObserver | None = None,
    **settings: object,
) -> AsyncIterator[DelayedMessageMover]:
    """A mover running on ``store``; its critical errors go to ``critical``; without that
    list the mover must raise none."""
    expect_none = critical is None
    critical = [] if critical is None else critical
    mover = DelayedMessageMover(
        store=store, pool=transport.pool, dsn=transport.dsn, endpoint="orders",
        schema="public", error_address=QueueAddress(error_queue),
        settings=DelayedDeliverySettings(**settings),  # type: ignore[arg-type]
        on_critical_error=lambda message, exc: critical.append(message),
        on_dispatched=on_dispatched,
    )
    task = asyncio.create_task(mover.run())
    try:
        yield mover
    finally:
        await mover.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if expect_none:
        assert critical == []


async def wait_for_depth(transport: PostgresTransport, queue: str, count: int,
                         limit_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while (depth := await transport.depth(queue)) < count:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{queue} holds {depth} of {count} after {limit_s} s")
        await asyncio.sleep(0.02)


async def test_fetch_locks_the_row_so_a_second_instance_skips_it(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    now = datetime.now(UTC)
    async with transport.pool.acquire() as connection:
        await store.store(connection, delayed(now - timedelta(seconds=1)))
        await store.store(connection, delayed(now + timedelta(hours=1)))
    async with transport.pool.acquire() as first, transport.pool.acquire() as second:
        async with first.transaction():
            fetched = await store.fetch_next_due(first)
            assert fetched is not None
            async with second.transaction():
                assert await store.fetch_next_due(second) is None  # locked, and the other not due
            assert await store.increment_failure_count(first, fetched)
            assert await store.remove(first, fetched)
            assert not await store.remove(first, fetched)
            assert not await store.increment_failure_count(first, fetched)
        next_due = await store.next_due_in(first)
    assert next_due is not None
    assert 3500 < next_due <= 3600


@pytest.mark.parametrize("deferral", ["delay", "deliver_at"])
async def test_messages_arrive_no_earlier_than_due_by_the_databases_clock(
    transport: PostgresTransport, store: PostgresDelayedMessageStore, database_dsn: str,
    deferral: str,
) -> None:
    """Arrival (the destination's insert) against the due time the store holds, both read by
    the database (``tests.support.arrivals``)."""
    await record_arrivals(transport.pool, QueueAddress("target"), store.table)
    sender = Sender("orders", TransportSettings(dsn=database_dsn), delayed_store=store)
    async with running_mover(transport, store):
        ids = []
        for i in range(5):
            wait = timedelta(seconds=0.3 + i / 10)
            if deferral == "delay":
                ids.append(await sender.send(Reminder(f"r{i}"), "target", delay=wait))
            else:
                ids.append(await sender.send(Reminder(f"r{i}"), "target",
                                             deliver_at=datetime.now(UTC) + wait))
        await wait_for_depth(transport, "target", 5)
    await sender.close()

    arrived = await arrivals(transport.pool)
    assert sorted(str(a.id) for a in arrived) == sorted(ids)
    for arrival in arrived:
        assert_on_time(arrival)


async def test_past_due_time_is_delivered_at_once_without_the_store(
    transport: PostgresTransport, store: PostgresDelayedMessageStore, database_dsn: str
) -> None:
    sender = Sender("orders", TransportSettings(dsn=database_dsn), delayed_store=store)
    await sender.send(Reminder("late"), "target",
                      deliver_at=datetime.now(UTC) - timedelta(minutes=5))
    await sender.close()
    assert await transport.depth("target") == 1  # no mover is running
    async with transport.pool.acquire() as connection:
        assert await store.next_due_in(connection) is None


async def test_two_movers_on_one_store_dispatch_each_message_once(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    now = datetime.now(UTC)
    messages = [delayed(now - timedelta(milliseconds=i)) for i in range(300)]
    async with transport.pool.acquire() as connection:
        for message in messages:
            await store.store(connection, message)
    async with running_mover(transport, store, batch_size=7) as one, \
            running_mover(transport, store, batch_size=7) as two:
        await wait_for_depth(transport, "target", 300)
        assert one.dispatched > 0
        assert two.dispatched > 0  # both took part: the test really had two competitors
    ids = await transport.pool.fetch(f"SELECT id FROM {QueueAddress('target').qualified}")
    assert sorted(r["id"] for r in ids) == sorted(m.id for m in messages)


async def test_delayed_message_to_a_missing_queue_ends_in_the_error_queue(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    async with transport.pool.acquire() as connection:
        await store.store(connection, delayed(datetime.now(UTC), destination="nowhere"))
    async with running_mover(transport, store, number_of_retries=1,
                             maximum_recovery_failures_per_second=50):
        await wait_for_depth(transport, "error", 1)
    failed = await transport.receive("error")
    assert isinstance(failed, TransportMessage)
    assert failed.headers[ErrorHeaders.FAILED_QUEUE] == "nowhere"
    assert "QueueNotFoundError" in failed.headers[ErrorHeaders.EXCEPTION_TYPE]
    async with transport.pool.acquire() as connection:
        assert await store.next_due_in(connection) is None


class TwoTableStore:
    """A user store with another layout: due times and payloads in separate tables."""

    notify_channel = None

    async def setup_infrastructure(self, connection: asyncpg.Connection) -> None:
        await connection.execute("""
            CREATE TABLE IF NOT EXISTS my_due (id uuid PRIMARY KEY, at timestamptz NOT NULL,
                                               attempts int NOT NULL DEFAULT 0);
            CREATE TABLE IF NOT EXISTS my_payload (id uuid PRIMARY KEY, target text,
                                                   head text, payload bytea)""")

    async def store(self, connection: asyncpg.Connection, message: DelayedMessage) -> None:
        await connection.execute("INSERT INTO my_due (id, at) VALUES ($1, $2)",
                                 message.id, message.due)
        await connection.execute("INSERT INTO my_payload VALUES ($1, $2, $3, $4)",
                                 message.id, message.destination, message.headers, message.body)

    async def fetch_next_due(self, connection: asyncpg.Connection) -> DelayedMessage | None:
        row = await connection.fetchrow("""
            SELECT d.id, d.at, d.attempts, p.target, p.head, p.payload
            FROM my_due d JOIN my_payload p USING (id) WHERE d.at <= now()
            ORDER BY d.at LIMIT 1 FOR UPDATE OF d SKIP LOCKED""")
        if row is None:
            return None
        return DelayedMessage(id=row["id"], destination=row["target"], due=row["at"],
                              headers=row["head"], body=row["payload"], failures=row["attempts"])

    async def remove(self, connection: asyncpg.Connection, message: DelayedMessage) -> bool:
        await connection.execute("DELETE FROM my_payload WHERE id = $1", message.id)
        status = await connection.execute("DELETE FROM my_due WHERE id = $1", message.id)
        return bool(status.endswith(" 1"))

    async def increment_failure_count(
        self, connection: asyncpg.Connection, message: DelayedMessage
    ) -> bool:
        status = await connection.execute(
            "UPDATE my_due SET attempts = attempts + 1 WHERE id = $1", message.id)
        return bool(status.endswith(" 1"))

    async def next_due_in(self, connection: asyncpg.Connection) -> float | None:
        value = await connection.fetchval(
            "SELECT extract(epoch FROM min(at) - now())::float8 FROM my_due")
        return float(value) if value is not None else None


async def test_a_store_of_the_users_own_plugs_in(
    transport: PostgresTransport, database_dsn: str
) -> None:
    store = TwoTableStore()
    assert isinstance(store, DelayedMessageStore)
    async with transport.pool.acquire() as connection:
        await store.setup_infrastructure(connection)
    await transport.create_queue("target")
    await transport.create_queue("error")
    sender = Sender("orders", TransportSettings(dsn=database_dsn), delayed_store=store)
    await sender.send(Reminder("custom"), "target", delay=timedelta(seconds=0.3))
    await sender.close()
    assert await transport.pool.fetchval("SELECT count(*) FROM my_due") == 1
    async with running_mover(transport, store, initial_backoff=0.05):
        await wait_for_depth(transport, "target", 1)
    assert await transport.pool.fetchval("SELECT count(*) FROM my_due") == 0


def test_deferral_rules_fail_clearly() -> None:
    endpoint = Endpoint("orders")
    assert endpoint.delayed_store is not None
    web = Sender("web")
    send_only = Endpoint("web", send_only=True)
    assert send_only.delayed_store is None

    async def attempts() -> None:
        with pytest.raises(ConfigurationError, match="send-only"):
            await web.send(Reminder("x"), "target", delay=timedelta(seconds=1))
        with pytest.raises(ConfigurationError, match="send-only"):
            await send_only.send(Reminder("x"), "target", delay=timedelta(seconds=1))
        with pytest.raises(ConfigurationError, match="time_to_be_received"):
            await endpoint.send(Reminder("x"), "target", delay=timedelta(seconds=1),
                                time_to_be_received=timedelta(minutes=1))
        with pytest.raises(ConfigurationError, match="not both"):
            await endpoint.send(Reminder("x"), "target", delay=timedelta(seconds=1),
                                deliver_at=datetime.now(UTC))

    asyncio.run(attempts())


async def test_one_message_deferred_to_two_queues_reaches_both(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    await transport.create_queue("second_target")
    shared_id = uuid.uuid4()
    now = datetime.now(UTC)
    async with transport.pool.acquire() as connection:
        for destination in ("target", "second_target"):
            await store.store(connection, DelayedMessage(
                id=shared_id, destination=destination, due=now, headers="{}", body=b"{}"))
    async with running_mover(transport, store):
        await wait_for_depth(transport, "target", 1)
        await wait_for_depth(transport, "second_target", 1)


async def test_an_undeliverable_message_holds_up_no_other(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    """Due first: a message whose destination is no queue name at all, and whose move to the
    error queue fails too (that queue is missing). The messages due after it still go."""
    now = datetime.now(UTC)
    async with transport.pool.acquire() as connection:
        await store.store(connection, delayed(now - timedelta(seconds=5), destination="x" * 80))
        for _ in range(3):
            await store.store(connection, delayed(now))
    async with running_mover(transport, store, error_queue="missing_error",
                             maximum_recovery_failures_per_second=50):
        await wait_for_depth(transport, "target", 3)
        deadline = asyncio.get_running_loop().time() + 10
        while not await transport.pool.fetchval(  # counted, not lost
                'SELECT failures FROM "orders.delayed" WHERE destination <> $1', "target"):
            assert asyncio.get_running_loop().time() < deadline, "the failure was not counted"
            await asyncio.sleep(0.02)
    rows = await transport.pool.fetch('SELECT destination, failures, due FROM "orders.delayed"')
    assert [(r["destination"], r["failures"] >= 1) for r in rows] == [("x" * 80, True)]
    assert rows[0]["due"] > now  # postponed behind the others


async def test_a_second_deferral_of_one_id_to_one_queue_is_kept(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    first = delayed(datetime.now(UTC))
    second = msgspec.structs.replace(first, body=b'{"second":true}')
    async with transport.pool.acquire() as connection:
        await store.store(connection, first)
        await store.store(connection, second)
    async with running_mover(transport, store):
        await wait_for_depth(transport, "target", 2)
    bodies = sorted(bytes(r["body"]) for r in await transport.pool.fetch("SELECT body FROM target"))
    assert bodies == [b'{"second":true}', b"{}"]


class FailureTimes:
    """The store, with the time of every failure the mover counts."""

    def __init__(self, store: PostgresDelayedMessageStore) -> None:
        self.store = store
        self.notify_channel = store.notify_channel
        self.times: list[float] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def increment_failure_count(
        self, connection: asyncpg.Connection, message: DelayedMessage
    ) -> bool:
        self.times.append(time.monotonic())
        return await self.store.increment_failure_count(connection, message)


async def test_the_mover_counts_failures_no_faster_than_its_rate_limit(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    """maximum_recovery_failures_per_second: eight undeliverable messages due at once are
    counted at most five a second (the limiter waits before each count but the first)."""
    async with transport.pool.acquire() as connection:
        for _ in range(8):
            await store.store(connection, delayed(datetime.now(UTC), destination="nowhere"))
    timed = FailureTimes(store)
    async with running_mover(transport, timed, number_of_retries=100,
                             maximum_recovery_failures_per_second=5):
        deadline = time.monotonic() + 30
        while len(timed.times) < 8:
            assert time.monotonic() < deadline, f"{len(timed.times)} failures counted"
            await asyncio.sleep(0.02)
    span = timed.times[7] - timed.times[0]
    # Seven intervals of at least 0.2 s; 0.1 s less for the first count's own round trip.
    assert span >= 7 * 0.2 - 0.1, timed.times[:8]


async def critical_error_raised(critical: list[str], started: float, *,
                                time_to_trigger: float) -> None:
    """Wait (20 s at most) for the first critical error; not before ``time_to_trigger``."""
    while not critical:
        assert time.monotonic() - started < 20, "no critical error"
        await asyncio.sleep(0.02)
    assert time.monotonic() - started >= time_to_trigger


async def test_the_fetch_breaker_raises_the_critical_error_and_disarms_when_fetches_work(
    transport: PostgresTransport,
) -> None:
    """A store whose fetches fail (its table does not exist yet) triggers the fetch breaker
    after time_to_trigger_fetch_circuit_breaker; once the table exists, it disarms."""
    missing = PostgresDelayedMessageStore.for_endpoint(QueueAddress("later"))
    critical: list[str] = []
    started = time.monotonic()
    async with running_mover(transport, missing, critical=critical,
                             time_to_trigger_fetch_circuit_breaker=0.5) as mover:
        await critical_error_raised(critical, started, time_to_trigger=0.5)
        assert "'delayed-fetch' triggered" in critical[0]
        assert mover.fetch_breaker.state is BreakerState.TRIGGERED
        async with transport.pool.acquire() as connection:
            await missing.setup_infrastructure(connection)
        while mover.fetch_breaker.state is not BreakerState.DISARMED:
            assert time.monotonic() - started < 40, "the fetch breaker did not disarm"
            await asyncio.sleep(0.02)
    assert len(critical) == 1


async def test_the_dispatch_breaker_raises_the_critical_error_and_disarms_on_a_dispatch(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    """A due message whose dispatch keeps failing (its queue does not exist yet) triggers the
    dispatch breaker after time_to_trigger_dispatch_circuit_breaker; the first dispatch that
    works (the queue created) disarms it."""
    async with transport.pool.acquire() as connection:
        await store.store(connection, delayed(datetime.now(UTC), destination="created_later"))
    critical: list[str] = []
    started = time.monotonic()
    async with running_mover(transport, store, critical=critical, number_of_retries=100,
                             maximum_recovery_failures_per_second=50,
                             time_to_trigger_dispatch_circuit_breaker=0.5) as mover:
        await critical_error_raised(critical, started, time_to_trigger=0.5)
        assert "'delayed-dispatch' triggered" in critical[0]
        assert mover.dispatch_breaker.state is BreakerState.TRIGGERED
        await transport.create_queue("created_later")
        await wait_for_depth(transport, "created_later", 1, limit_s=20)
        assert mover.dispatch_breaker.state is BreakerState.DISARMED
    assert len(critical) == 1


async def test_the_dispatch_observer_hears_each_attempt_and_cannot_stop_the_mover(
    transport: PostgresTransport, store: PostgresDelayedMessageStore
) -> None:
    """What a traced endpoint's spans are made of: each attempt's message, start, failure
    and outcome; an observer that raises is logged and the mover goes on."""
    heard: list[tuple[str, str, str | None, int]] = []

    def observe(message: DelayedMessage, started: int, error: Exception | None,
                outcome: str) -> None:
        heard.append((message.destination, outcome, type(error).__name__ if error else None,
                      started))
        raise RuntimeError("an observer's bug")

    before = time.time_ns()
    async with transport.pool.acquire() as connection:
        await store.store(connection, delayed(datetime.now(UTC), destination="nowhere"))
        await store.store(connection, delayed(datetime.now(UTC)))
    async with running_mover(transport, store, number_of_retries=1, on_dispatched=observe,
                             maximum_recovery_failures_per_second=50):
        await wait_for_depth(transport, "target", 1)
        await wait_for_depth(transport, "error", 1)
    assert sorted(entry[:3] for entry in heard) == [
        ("nowhere", "error_queue", "QueueNotFoundError"),
        ("nowhere", "postponed", "QueueNotFoundError"),
        ("target", "dispatched", None)]
    assert all(before <= started <= time.time_ns() for *_, started in heard)
