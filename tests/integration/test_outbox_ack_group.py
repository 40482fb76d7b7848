"""The outbox's dispatch with the business commit, and its acks committed in groups (real
PostgreSQL, driven through the receive strategy, no Ray)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.settings import OutboxSettings
from endpoint_runtime.transactions.base import Round
from endpoint_runtime.transactions.outbox_receive import OutboxStrategy
from endpoint_runtime.transport.connection import QUERY_ERRORS
from endpoint_runtime.wire.messages import TransportMessage
from tests.integration.test_outbox import counts, drain, prepare
from tests.support.expiry import send_expiring, wait_until_expired
from tests.support.outbox_endpoints import PayInvoice, receipts

HANDLED = Round(taken=1, handled=1)


async def send(transport: PostgresTransport, *invoices: str) -> None:
    for invoice in invoices:
        await transport.send("receipts", create_outgoing(PayInvoice(invoice)))


async def test_acks_commit_once_per_group_while_each_dispatch_commits_at_once(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, receipts)  # acks_per_commit=3
    await send(transport, "a", "b", "c", "d")

    seen = []
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        for _ in range(4):
            assert await slot.round() == HANDLED
            # Other sessions still see rows whose DELETE has not committed.
            seen.append((await transport.depth("receipts"), await transport.depth("ledger")))
        await slot.close()  # commits the ack left waiting

    assert seen == [(4, 1), (4, 2), (1, 3), (1, 4)]
    assert await transport.depth("receipts") == 0
    assert await counts(transport) == (4, 4, 4)
    records = await transport.pool.fetchval(
        'SELECT count(*) FROM "receipts_OutboxData" WHERE dispatched AND operations IS NULL')
    assert records == 4


@pytest.mark.parametrize("pessimistic", [False, True])
async def test_a_message_that_expires_while_acks_wait_is_not_handled(
    transport: PostgresTransport, pessimistic: bool,
) -> None:
    """The group's receive transaction stays open over several messages; a message that
    expires while it is open is deleted by the next receive and never handled."""
    await prepare(transport, receipts)
    settings = msgspec.structs.replace(
        receipts.settings, outbox=OutboxSettings(pessimistic=pessimistic, acks_per_commit=3))
    strategy = receipts.create_strategy(receipts.create_pipeline(settings), transport.pool,
                                       settings)
    assert isinstance(strategy, OutboxStrategy)
    await send(transport, "a")
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert await slot.round() == HANDLED
        assert await transport.depth("receipts") == 1  # the ack waits: the transaction is open
        await send_expiring(transport, "receipts", PayInvoice("expired"))
        await send(transport, "b")
        await wait_until_expired(transport, "receipts", count=1)

        assert await slot.round() == HANDLED
        await slot.close()

    paid = await transport.pool.fetch("SELECT invoice FROM paid_invoices ORDER BY invoice")
    assert [row["invoice"] for row in paid] == ["a", "b"]
    assert await transport.depth("receipts") == 0
    assert strategy.handler_runs == 2


async def test_an_empty_queue_commits_the_waiting_acks(transport: PostgresTransport) -> None:
    strategy = await prepare(transport, receipts)
    await send(transport, "a")
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert await slot.round() == HANDLED
        assert await transport.depth("receipts") == 1  # the ack waits
        assert await slot.round() == Round()
        assert not connection.is_in_transaction()
        assert await transport.depth("receipts") == 0
        await slot.close()


async def test_a_failure_rolls_back_the_waiting_acks_and_their_messages_are_only_acked(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, receipts)
    await send(transport, "a", "refused", "b")

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert await slot.round() == HANDLED  # "a": its ack waits
        failed = await slot.round()  # rolls back the ack of "a" too
        assert failed == Round(taken=1, failed=1)
        assert await transport.depth("receipts") == 3
        await slot.close()
    await drain(transport, strategy)

    payments, ledger, runs = await counts(transport)
    assert (payments, ledger) == (2, 2)  # "a" and "b", each written and dispatched once
    assert runs == 3  # "a" did not run again: it came back as a recorded duplicate
    assert strategy.duplicates == 1
    assert await transport.depth("error") == 1  # "refused" (no retries configured)
    assert await transport.depth("receipts") == 0


async def test_a_dispatch_that_fails_after_the_business_commit_is_made_by_the_receive(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, receipts)
    await transport.pool.execute("""
        CREATE SEQUENCE ledger_inserts;
        CREATE FUNCTION refuse_first_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('ledger_inserts') = 1 THEN
                RAISE EXCEPTION 'the first insert into ledger is refused';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_first BEFORE INSERT ON "public"."ledger"
            FOR EACH ROW EXECUTE FUNCTION refuse_first_insert()""")
    await send(transport, "a")

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert await slot.round() == HANDLED
        await slot.close()

    assert await transport.pool.fetchval("SELECT last_value FROM ledger_inserts") == 2
    assert await counts(transport) == (1, 1, 1)
    assert await transport.depth("receipts") == 0
    assert strategy.handler_runs == 1


async def test_acks_per_commit_of_one_commits_every_message(
    transport: PostgresTransport,
) -> None:
    await prepare(transport, receipts)
    settings = msgspec.structs.replace(receipts.settings,
                                       outbox=OutboxSettings(acks_per_commit=1))
    strategy = receipts.create_strategy(receipts.create_pipeline(settings), transport.pool,
                                       settings)
    assert isinstance(strategy, OutboxStrategy)
    await send(transport, "a", "b")
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert await slot.round() == HANDLED
        assert await transport.depth("receipts") == 1  # committed at once
        await slot.close()
    assert await transport.depth("receipts") == 1


@pytest.mark.parametrize("pessimistic", [False, True])
async def test_a_handler_that_sends_nothing_stores_its_record_dispatched(
    transport: PostgresTransport, pessimistic: bool,
) -> None:
    await prepare(transport, receipts)
    settings = msgspec.structs.replace(
        receipts.settings, outbox=OutboxSettings(pessimistic=pessimistic, acks_per_commit=3))
    strategy = receipts.create_strategy(receipts.create_pipeline(settings), transport.pool,
                                       settings)
    assert isinstance(strategy, OutboxStrategy)
    await send(transport, "quiet", "quiet")  # two messages, each its own message id

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert await slot.round() == HANDLED
        records = await transport.pool.fetch(
            'SELECT dispatched, dispatched_at IS NOT NULL AS stamped, operations '
            'FROM "receipts_OutboxData"')
        assert [tuple(r) for r in records] == [(True, True, None)]
        assert await transport.depth("receipts") == 2  # nothing to dispatch: the ack waits
        await slot.close()
    await drain(transport, strategy)
    assert await counts(transport) == (2, 0, 2)
    assert strategy.duplicates == 0


async def test_a_send_to_a_missing_queue_fails_the_message_naming_the_queue(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, receipts)
    await send(transport, "astray")
    await drain(transport, strategy)

    failed = await transport.receive("error")
    assert isinstance(failed, TransportMessage)
    assert "no_such_ledger" in failed.headers[ErrorHeaders.MESSAGE]
    assert failed.headers[ErrorHeaders.EXCEPTION_TYPE].endswith("QueueNotFoundError")
    assert await counts(transport) == (0, 0, 1)  # the business work rolled back


async def test_a_slot_whose_receive_connection_was_lost_closes_and_returns_both(
    transport: PostgresTransport,
) -> None:
    """Found by the chaos run: asyncpg detaches a pool's proxy when its connection is lost,
    and every call on it then raises, ``is_closed()`` too. The slot's close raised on the
    lost receive connection and never gave the business connection back: it stayed idle in
    a transaction and the receiver's drain waited for it forever."""
    strategy = await prepare(transport, receipts)
    await send(transport, "a", "b")
    connection = await transport.pool.acquire()
    slot = strategy.open_slot(connection)
    assert await slot.round() == HANDLED  # its ack waits; the business connection is kept
    receive_pid = connection.get_server_pid()
    await transport.pool.execute("SELECT pg_terminate_backend($1)", receive_pid)

    # The next round meets the loss: as a lost connection, or (when the server's notice of
    # the termination arrives mid-query) as asyncpg's protocol caught in another state.
    with pytest.raises(QUERY_ERRORS):
        await slot.round()
    await slot.close()
    await transport.pool.release(connection)

    # Both went back: the pool can hand out its every connection again, none in a transaction.
    size = transport.pool.get_max_size()
    held = [await asyncio.wait_for(transport.pool.acquire(), 5) for _ in range(size)]
    try:
        assert not any(held_connection.is_in_transaction() for held_connection in held)
    finally:
        for held_connection in held:
            await transport.pool.release(held_connection)
    assert await transport.depth("receipts") == 2  # the lost ack: "a" comes again
