"""Sagas on a real PostgreSQL, each mode's receive strategy on one slot (no Ray): both orders
of arrival, every transaction mode, saga not found (default and hook), timeouts before and
after completion, replies found by saga id, the audit headers, an optimistic conflict retried,
redelivery in outbox mode, and the table in NServiceBus SQL persistence's layout."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from endpoint_runtime import Atomic, Endpoint, HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import install
from endpoint_runtime.delayed.mover import DelayedMessageMover
from endpoint_runtime.sagas import Saga, handles, starts
from endpoint_runtime.settings import DelayedDeliverySettings
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import ErrorHeaders, Headers, MessageIntent
from tests.support.draining import drain, received_all
from tests.support.saga_endpoints import (
    HOLD_KEY,
    MODES,
    AskPayment,
    Bump,
    Cancelled,
    OrderSaga,
    OrderState,
    Paid,
    PaymentAccepted,
    Placed,
    Ship,
    saga_endpoint,
)

TABLE = QueueAddress("fulfilment_OrderSaga")


async def prepared(transport: PostgresTransport, endpoint: Endpoint) -> Endpoint:
    await install(transport, endpoint, endpoint.settings)
    for queue in ("shipments", "customers", "payments"):
        await transport.create_queue(queue)
    return endpoint


async def send(transport: PostgresTransport, message: msgspec.Struct, *,
               message_id: str | None = None, headers: dict[str, str] | None = None) -> str:
    outgoing = create_outgoing(message, message_id=message_id, reply_to="customers",
                               headers=headers)
    await transport.send("fulfilment", outgoing)
    return outgoing.message_id


async def rows(transport: PostgresTransport) -> list[dict[str, Any]]:
    return [dict(row) for row in await transport.pool.fetch(
        f'SELECT "Id", "Concurrency", "Data"::text AS data, "Correlation_order_id" '
        f'FROM {TABLE.qualified} ORDER BY "Correlation_order_id"')]


async def state_of(transport: PostgresTransport, order_id: str) -> OrderState | None:
    data = await transport.pool.fetchval(
        f'SELECT "Data"::text FROM {TABLE.qualified} WHERE "Correlation_order_id" = $1',
        order_id)
    return None if data is None else msgspec.json.decode(data, type=OrderState)


async def all_consumed(transport: PostgresTransport) -> None:
    """Every message of the endpoint was taken, none went to the error queue."""
    assert await transport.depth("fulfilment") == 0
    assert await transport.depth("error") == 0


def bodies(messages: list[Any], kind: type) -> list[Any]:
    return [msgspec.json.decode(m.body, type=kind) for m in messages]


@pytest.mark.parametrize("first", ["placed", "paid"])
async def test_placed_and_paid_in_either_order_ship_once_and_complete(
    transport: PostgresTransport, first: str,
) -> None:
    endpoint = await prepared(transport, saga_endpoint())
    arrivals = [Placed("o-1"), Paid("o-1")]
    if first == "paid":
        arrivals.reverse()
    await send(transport, arrivals[0])
    await drain(transport, endpoint)
    assert [r["Correlation_order_id"] for r in await rows(transport)] == ["o-1"]
    assert await transport.depth("shipments") == 0

    await send(transport, arrivals[1])
    await drain(transport, endpoint)

    assert bodies(await received_all(transport, "shipments"), Ship) == [Ship("o-1")]
    assert await rows(transport) == []  # completion deletes the row
    replies = await received_all(transport, "customers")  # reply to the originator
    assert bodies(replies, Ship) == [Ship("o-1")]
    assert replies[0].headers[Headers.MESSAGE_INTENT] == MessageIntent.REPLY


@pytest.mark.parametrize("mode", MODES)
async def test_every_mode_keeps_state_between_messages_and_completes(
    transport: PostgresTransport, mode: str,
) -> None:
    endpoint = await prepared(transport, saga_endpoint(mode))
    await send(transport, Placed("o-1", timeout_s=3600))
    await send(transport, Bump("o-1"))
    await send(transport, Bump("o-1"))
    await drain(transport, endpoint)

    (row,) = await rows(transport)
    assert msgspec.json.decode(row["data"], type=OrderState) == OrderState(
        order_id="o-1", placed=True, bumps=2)
    assert row["Concurrency"] == 3  # inserted at 1, two updates
    (timeout,) = await transport.pool.fetch('SELECT headers FROM "fulfilment.delayed"')
    assert msgspec.json.decode(timeout["headers"])[Headers.SAGA_ID] == str(row["Id"])

    await send(transport, Paid("o-1"))
    await drain(transport, endpoint)
    assert bodies(await received_all(transport, "shipments"), Ship) == [Ship("o-1", bumps=2)]
    assert await rows(transport) == []
    await all_consumed(transport)


async def test_a_message_that_finds_no_saga_is_logged_and_consumed(
    transport: PostgresTransport,
) -> None:
    endpoint = await prepared(transport, saga_endpoint())
    await send(transport, Bump("nobody"))
    with capture_logs() as logs:
        await drain(transport, endpoint)
    assert [e for e in logs if e["event"] == "saga_not_found"] == [{
        "event": "saga_not_found", "log_level": "info",
        "saga_types": ["tests.support.saga_endpoints.OrderSaga"], "message_type": "Bump"}]
    assert await rows(transport) == []
    await all_consumed(transport)


class Shadow(Saga[OrderState]):
    """A second saga of Bump: it never has the instance OrderSaga has."""

    correlation = "order_id"

    @starts(correlate="order_id")
    async def paid(self, message: Paid, context: HandlerContext) -> None: ...

    @handles(correlate="order_id")
    async def bump(self, message: Bump, context: HandlerContext) -> None: ...


async def test_the_not_found_hooks_run_once_when_no_saga_has_an_instance(
    transport: PostgresTransport,
) -> None:
    """NServiceBus's rule: "not found" is per message. A Bump that one of two sagas finds is
    no saga-not-found; one that neither finds runs the hook once, and its sends commit."""
    endpoint = saga_endpoint()
    endpoint.saga(Shadow)
    await prepared(transport, endpoint)
    seen: list[Any] = []

    @endpoint.sagas.on_not_found
    async def unknown(message: Any, context: HandlerContext) -> None:
        seen.append(message)
        await context.reply(Cancelled(message.order_id))

    await send(transport, Placed("o-1"))
    await send(transport, Bump("o-1"))
    await send(transport, Bump("nobody"))
    with capture_logs() as logs:
        await drain(transport, endpoint)
    assert seen == [Bump("nobody")]
    assert bodies(await received_all(transport, "customers"), Cancelled) == [
        Cancelled("nobody")]
    assert not [e for e in logs if e["event"] == "saga_not_found"]
    assert await state_of(transport, "o-1") == OrderState(order_id="o-1", placed=True, bumps=1)
    await all_consumed(transport)


async def move_timeouts_now(transport: PostgresTransport, endpoint: Endpoint) -> int:
    """Make every delayed message of ``endpoint`` due and move it (the deployment's mover
    does this on its own; here one pass, at once)."""
    store = endpoint.delayed_store
    assert store is not None
    await transport.pool.execute(f"UPDATE {store.table.qualified} SET due = now()")  # type: ignore[attr-defined]
    mover = DelayedMessageMover(
        store=store, pool=transport.pool, dsn=transport.dsn, endpoint=endpoint.name,
        schema="public", error_address=QueueAddress("error"),
        settings=DelayedDeliverySettings(), on_critical_error=lambda message, exc: None)
    moved, _ = await mover.move_due()
    return moved


async def test_a_timeout_before_completion_reaches_the_saga_by_its_id(
    transport: PostgresTransport,
) -> None:
    endpoint = await prepared(transport, saga_endpoint())
    await send(transport, Placed("o-1", timeout_s=3600))
    await drain(transport, endpoint)
    (row,) = await rows(transport)

    assert await move_timeouts_now(transport, endpoint) == 1
    (timeout,) = await transport.pool.fetch('SELECT headers FROM "fulfilment"')
    headers = msgspec.json.decode(timeout["headers"])
    assert headers[Headers.SAGA_ID] == str(row["Id"])
    assert headers[Headers.IS_SAGA_TIMEOUT] == "True"
    await drain(transport, endpoint)

    assert bodies(await received_all(transport, "shipments"), Cancelled) == [Cancelled("o-1")]
    assert await rows(transport) == []


async def test_a_timeout_after_completion_is_ignored(transport: PostgresTransport) -> None:
    endpoint = await prepared(transport, saga_endpoint())
    await send(transport, Placed("o-1", timeout_s=3600))
    await send(transport, Paid("o-1"))  # ships and completes
    await drain(transport, endpoint)
    assert await rows(transport) == []
    assert await move_timeouts_now(transport, endpoint) == 1

    with capture_logs() as logs:
        await drain(transport, endpoint)
    assert [e["event"] for e in logs if e["event"].startswith("saga_")] == [
        "saga_timeout_ignored"]
    assert bodies(await received_all(transport, "shipments"), Ship) == [Ship("o-1")]
    await all_consumed(transport)


async def test_a_reply_finds_its_saga_by_the_saga_id_headers(
    transport: PostgresTransport,
) -> None:
    endpoint = await prepared(transport, saga_endpoint())
    payments = Endpoint("payments")

    @payments.handler
    async def accept(message: AskPayment, context: HandlerContext) -> None:
        await context.reply(PaymentAccepted(reference=f"ref-{message.order_id}"))

    await send(transport, Placed("o-1", ask_payment=True))
    await drain(transport, endpoint)
    (row,) = await rows(transport)
    (request,) = await transport.pool.fetch('SELECT headers FROM "payments"')
    assert msgspec.json.decode(request["headers"])[Headers.ORIGINATING_SAGA_ID] == str(row["Id"])
    await drain(transport, payments)
    (reply,) = await transport.pool.fetch('SELECT headers FROM "fulfilment"')
    assert msgspec.json.decode(reply["headers"])[Headers.SAGA_ID] == str(row["Id"])
    await drain(transport, endpoint)

    assert await state_of(transport, "o-1") == OrderState(
        order_id="o-1", placed=True, reference="ref-o-1")


async def test_the_audit_copy_names_the_saga_and_what_became_of_it(
    transport: PostgresTransport,
) -> None:
    endpoint = await prepared(transport, saga_endpoint(audit_queue="audit"))
    await send(transport, Placed("o-1"))
    await send(transport, Bump("o-1"))
    await send(transport, Paid("o-1"))
    await drain(transport, endpoint)

    changes = [m.headers[Headers.SAGA_CHANGES].rsplit(":", 1)[1]
               for m in await received_all(transport, "audit")]
    assert changes == ["New", "Updated", "Completed"]


WAITING_FOR_LOCK = """
    SELECT count(*) FROM pg_stat_activity
    WHERE wait_event_type = 'Lock' AND datname = current_database()"""


async def until_waiting(transport: PostgresTransport, backends: int) -> None:
    """Until ``backends`` sessions of the test's database wait for a lock (10 s at most)."""
    async with asyncio.timeout(10):
        while True:
            if await transport.pool.fetchval(WAITING_FOR_LOCK) >= backends:
                return
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["atomic", "batched", "outbox"])
async def test_an_optimistic_conflict_fails_the_attempt_and_the_retry_reads_afresh(
    transport: PostgresTransport, mode: str,
) -> None:
    """``Bump`` reads the instance at Concurrency 1, then waits (on a lock the test holds)
    while another transaction changes the instance: its update finds no row at 1, the
    attempt fails with SagaConcurrencyError, and the retry adds its bump to the new state
    (nothing lost, nothing doubled)."""
    endpoint = await prepared(transport, saga_endpoint(mode))
    await send(transport, Placed("o-1"))
    await drain(transport, endpoint)
    await send(transport, Bump("o-1", hold=True))
    async with transport.pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", HOLD_KEY)
        with capture_logs() as logs:
            draining = asyncio.create_task(drain(transport, endpoint))
            await until_waiting(transport, 1)
            await transport.pool.execute(  # another message's committed change
                f"""UPDATE {TABLE.qualified} SET "Concurrency" = "Concurrency" + 1,
                    "Data" = jsonb_set("Data", '{{bumps}}', '100')""")
            await holder.execute("SELECT pg_advisory_unlock($1)", HOLD_KEY)
            await draining

    assert await state_of(transport, "o-1") == OrderState(order_id="o-1", placed=True,
                                                          bumps=101)
    assert [row["Concurrency"] for row in await rows(transport)] == [3]
    failures = [e for e in logs if e["event"] == "message_failed"]
    assert len(failures) == 1
    assert "SagaConcurrencyError" in failures[0]["error"]
    await all_consumed(transport)


@pytest.mark.parametrize("isolation", ["optimistic", "savepoint"])
async def test_a_conflict_in_the_middle_of_a_batch_charges_only_the_conflicting_message(
    transport: PostgresTransport, isolation: str,
) -> None:
    """A batch of four: two new instances, the conflicting ``Bump`` of o-1, a third new
    instance. The conflict fails only the bump (one failed attempt, retried onto the new
    state); the other three instances are created once each (Concurrency 1: a replayed
    message's first save was rolled back, never doubled) and nothing goes to the error queue."""
    endpoint = await prepared(transport, saga_endpoint(
        "batched", transaction=Atomic(batch=4, isolation=isolation)))
    await send(transport, Placed("o-1"))
    await drain(transport, endpoint)
    for message in (Placed("o-2"), Placed("o-3"), Bump("o-1", hold=True), Placed("o-4")):
        await send(transport, message)
    async with transport.pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", HOLD_KEY)
        with capture_logs() as logs:
            draining = asyncio.create_task(drain(transport, endpoint))
            await until_waiting(transport, 1)
            await transport.pool.execute(
                f"""UPDATE {TABLE.qualified} SET "Concurrency" = "Concurrency" + 1,
                    "Data" = jsonb_set("Data", '{{bumps}}', '100')
                    WHERE "Correlation_order_id" = 'o-1'""")
            await holder.execute("SELECT pg_advisory_unlock($1)", HOLD_KEY)
            await draining

    assert [(row["Correlation_order_id"], row["Concurrency"]) for row in await rows(transport)] \
        == [("o-1", 3), ("o-2", 1), ("o-3", 1), ("o-4", 1)]
    assert await state_of(transport, "o-1") == OrderState(order_id="o-1", placed=True,
                                                          bumps=101)
    failures = [e for e in logs if e["event"] == "message_failed"]
    assert len(failures) == 1, failures
    assert "SagaConcurrencyError" in failures[0]["error"]
    await all_consumed(transport)


async def test_a_redelivered_message_changes_the_state_once_with_the_outbox(
    transport: PostgresTransport,
) -> None:
    endpoint = await prepared(transport, saga_endpoint("outbox"))
    await send(transport, Placed("o-1"))
    bump_id = str(uuid.uuid4())
    await send(transport, Bump("o-1"), message_id=bump_id)
    await drain(transport, endpoint)
    await send(transport, Bump("o-1"), message_id=bump_id)  # the same message again
    await drain(transport, endpoint)

    assert await state_of(transport, "o-1") == OrderState(order_id="o-1", placed=True,
                                                          bumps=1)
    assert [row["Concurrency"] for row in await rows(transport)] == [2]


async def test_the_table_has_the_layout_of_nservicebus_sql_persistence(
    transport: PostgresTransport,
) -> None:
    await prepared(transport, saga_endpoint())
    columns = await transport.pool.fetch(
        "SELECT column_name, data_type, character_maximum_length, is_nullable "
        "FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
        TABLE.table)
    assert [tuple(c) for c in columns] == [
        ("Id", "uuid", None, "NO"),
        ("Metadata", "text", None, "NO"),
        ("Data", "jsonb", None, "NO"),
        ("PersistenceVersion", "character varying", 23, "YES"),
        ("SagaTypeVersion", "character varying", 23, "YES"),
        ("Concurrency", "integer", None, "NO"),
        ("Correlation_order_id", "character varying", 200, "YES"),
    ]
    unique = await transport.pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%UNIQUE%' "
        "AND indexdef LIKE '%Correlation_order_id%'", TABLE.table)
    assert unique is not None


async def test_pessimistic_locks_across_two_batches_deadlock_and_the_victim_is_retried(
    transport: PostgresTransport,
) -> None:
    """Two batched slots lock two instances in opposite orders (slot 1: A then B, slot 2: B
    then A): PostgreSQL ends one with a deadlock error, a failed attempt that is retried;
    every bump lands once."""
    endpoint = await prepared(transport, saga_endpoint("batched", concurrency="pessimistic",
                                                       transaction=Atomic(batch=2)))
    await send(transport, Placed("A"))
    await send(transport, Placed("B"))
    await drain(transport, endpoint)
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)
    async with transport.pool.acquire() as holder, transport.pool.acquire() as first, \
            transport.pool.acquire() as second:
        await holder.execute("SELECT pg_advisory_lock($1)", HOLD_KEY)
        await send(transport, Bump("A", hold=True))  # slot 1's batch: locks A, waits
        await send(transport, Bump("B"))             # ... then wants B
        slot_1 = strategy.open_slot(first)
        with capture_logs() as logs:
            round_1 = asyncio.create_task(slot_1.round())
            await until_waiting(transport, 1)
            await send(transport, Bump("B", hold=True))  # slot 2's batch: locks B, waits
            await send(transport, Bump("A"))             # ... then wants A
            slot_2 = strategy.open_slot(second)
            round_2 = asyncio.create_task(slot_2.round())
            await until_waiting(transport, 2)
            await holder.execute("SELECT pg_advisory_unlock($1)", HOLD_KEY)
            await asyncio.gather(round_1, round_2)
            for slot in (slot_1, slot_2):  # the victim's retry
                while (await slot.round()).taken:
                    pass
                await slot.close()

    assert (await state_of(transport, "A"), await state_of(transport, "B")) == (
        OrderState(order_id="A", placed=True, bumps=2),
        OrderState(order_id="B", placed=True, bumps=2))
    failures = [e for e in logs if e["event"] in ("message_failed", "batch_rolled_back")]
    assert failures, [e["event"] for e in logs]
    assert all("DeadlockDetectedError" in e["error"] for e in failures), failures
    await all_consumed(transport)


async def test_a_changed_state_type_is_read_when_it_can_be_and_refused_when_not(
    transport: PostgresTransport,
) -> None:
    """Rows written by another version of the state type (another ``SagaTypeVersion``): one
    whose data still decodes is read (a missing field takes its default), logged and saved
    with the current version; one whose data does not decode fails its message with
    SagaStateVersionError, which ends in the error queue."""
    endpoint = await prepared(transport, saga_endpoint(immediate_retries=0))
    current = endpoint.sagas.definitions[0].version
    for order_id, data in (("old", {"order_id": "old", "placed": True}),
                           ("bad", {"order_id": "bad", "bumps": "many"})):
        await transport.pool.execute(
            f'INSERT INTO {TABLE.qualified} ("Id", "Metadata", "Data", "PersistenceVersion", '
            '"SagaTypeVersion", "Concurrency", "Correlation_order_id") '
            "VALUES (gen_random_uuid(), '{}', $1::jsonb, 'p', 'older', 1, $2)",
            msgspec.json.encode(data).decode(), order_id)
        await send(transport, Bump(order_id))
    with capture_logs() as logs:
        await drain(transport, endpoint)

    assert await state_of(transport, "old") == OrderState(order_id="old", placed=True, bumps=1)
    versions = dict(await transport.pool.fetch(
        f'SELECT "Correlation_order_id", "SagaTypeVersion" FROM {TABLE.qualified}'))
    assert versions == {"old": current, "bad": "older"}
    assert [(e["stored"], e["current"]) for e in logs
            if e["event"] == "saga_state_version_changed"] == [("older", current)]
    (failed,) = await received_all(transport, "error")
    assert failed.headers[ErrorHeaders.EXCEPTION_TYPE].endswith(
        "SagaStateVersionError")


class Mismatched(Saga[OrderState]):
    correlation = "order_id"

    @starts(correlate=lambda message: len(message.order_id))  # an int for a text column
    async def placed(self, message: Placed, context: HandlerContext) -> None: ...


async def test_a_correlation_value_of_the_wrong_type_fails_the_message_clearly(
    transport: PostgresTransport,
) -> None:
    endpoint = Endpoint("fulfilment", immediate_retries=0, delayed_retries=0)
    endpoint.saga(Mismatched)
    await prepared(transport, endpoint)
    await send(transport, Placed("o-1"))
    await drain(transport, endpoint)

    (failed,) = await received_all(transport, "error")
    assert failed.headers[ErrorHeaders.EXCEPTION_TYPE].endswith("SagaError")
    assert failed.headers[ErrorHeaders.MESSAGE] == (
        "saga tests.integration.test_sagas.Mismatched: Placed maps to the correlation value 3 "
        "(int); its correlation field 'order_id' is str")


class Renamer(Saga[OrderState]):
    correlation = "order_id"

    @starts(correlate="order_id")
    async def placed(self, message: Placed, context: HandlerContext) -> None:
        self.state.order_id = message.order_id.upper()


async def test_a_handler_that_changes_the_correlation_field_fails_its_message(
    transport: PostgresTransport,
) -> None:
    endpoint = Endpoint("fulfilment", immediate_retries=0, delayed_retries=0)
    endpoint.saga(Renamer)
    await prepared(transport, endpoint)
    await send(transport, Placed("o-1"))
    await drain(transport, endpoint)

    (failed,) = await received_all(transport, "error")
    assert failed.headers[ErrorHeaders.EXCEPTION_TYPE].endswith("SagaError")
    assert "changed the correlation field 'order_id'" in failed.headers[ErrorHeaders.MESSAGE]
    assert await transport.pool.fetchval('SELECT count(*) FROM "fulfilment_Renamer"') == 0


async def test_a_saga_id_header_that_is_no_uuid_finds_nothing_and_is_consumed(
    transport: PostgresTransport,
) -> None:
    endpoint = await prepared(transport, saga_endpoint())
    await send(transport, PaymentAccepted(reference="r"), headers={
        Headers.SAGA_ID: "'; DROP TABLE x; --", Headers.SAGA_TYPE: OrderSaga.type_name()})
    with capture_logs() as logs:
        await drain(transport, endpoint)
    assert [e["event"] for e in logs if e["event"].startswith("saga_")] == [
        "saga_id_not_a_uuid", "saga_not_found"]
    await all_consumed(transport)


@pytest.mark.parametrize("mode", MODES)
async def test_the_state_is_as_durable_as_the_messages_other_work(
    transport: PostgresTransport, mode: str,
) -> None:
    """A handler after the saga fails the first attempt: the saga's update rolls back with
    it and the retry applies it once (every mode with a transaction); in none mode the update
    committed on its own and the failed message is in the error queue (at most once)."""
    endpoint = saga_endpoint(mode)
    attempts: list[int] = []

    @endpoint.handler
    async def fails_once(message: Bump, context: HandlerContext) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("after the saga saved")

    await prepared(transport, endpoint)
    await send(transport, Placed("o-1"))
    await send(transport, Bump("o-1"))
    await drain(transport, endpoint)

    assert await state_of(transport, "o-1") == OrderState(order_id="o-1", placed=True, bumps=1)
    assert [row["Concurrency"] for row in await rows(transport)] == [2]
    assert len(attempts) == (1 if mode == "none" else 2)
    assert await transport.depth("error") == (1 if mode == "none" else 0)
