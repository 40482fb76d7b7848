"""The outbox against a real PostgreSQL, driven through its receive strategy (no Ray)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import pytest

from endpoint_runtime import ConfigurationError, Endpoint, Outbox
from endpoint_runtime.chain.outbox.step import OutboxUnit
from endpoint_runtime.chain.outbox.storage import OutboxCleaner, OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.settings import OutboxSettings
from endpoint_runtime.transactions.base import BufferedDispatcher
from endpoint_runtime.transactions.outbox_receive import OutboxStrategy
from endpoint_runtime.transactions.receive_transaction import end_carried_transaction
from endpoint_runtime.transport import quote_identifier
from endpoint_runtime.transport.savepoints import OpenTransactionConnection
from endpoint_runtime.wire.messages import Headers, TransportMessage
from tests.support.outbox_endpoints import HELD_INVOICE_LOCK, PayInvoice, make
from tests.support.outbox_endpoints import optimistic as optimistic_endpoint
from tests.support.outbox_endpoints import pessimistic as pessimistic_endpoint


async def prepare(transport: PostgresTransport, endpoint: Endpoint) -> OutboxStrategy:
    for queue in (endpoint.name, "ledger", "handler_runs", "error", "client"):
        await transport.create_queue(queue)
    await transport.pool.execute("CREATE TABLE IF NOT EXISTS paid_invoices (invoice text)")
    async with transport.pool.acquire() as connection:
        storage = OutboxStorage.for_settings(endpoint.address, endpoint.settings)
        await storage.setup(connection)
        await storage.setup(connection)  # idempotent
        assert endpoint.delayed_store is not None
        await endpoint.delayed_store.setup_infrastructure(connection)
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)
    assert isinstance(strategy, OutboxStrategy)
    return strategy


async def send_duplicates(transport: PostgresTransport, queue: str, copies: int,
                          reply_to: str | None = None, invoice: str = "inv-1") -> None:
    """``copies`` rows (each its own row id) that carry one and the same message id: what
    a sender that retried, or a transport that redelivered, leaves in a queue."""
    message_id = str(uuid.uuid4())
    for _ in range(copies):
        await transport.send(queue, create_outgoing(
            PayInvoice(invoice), reply_to=reply_to,
            headers={Headers.MESSAGE_ID: message_id}))


async def drain(transport: PostgresTransport, strategy: OutboxStrategy) -> None:
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        while (await slot.round()).taken:
            pass
        await slot.close()


async def counts(transport: PostgresTransport) -> tuple[int, int, int]:
    payments = await transport.pool.fetchval("SELECT count(*) FROM paid_invoices")
    return payments, await transport.depth("ledger"), await transport.depth("handler_runs")


def test_outbox_needs_receive_only_mode() -> None:
    with pytest.raises(ConfigurationError, match="RECEIVE_ONLY"):
        Endpoint("atomic", outbox=OutboxSettings())
    with pytest.raises(ConfigurationError, match="isolation"):
        Endpoint("x", transaction=Outbox(isolation="dirty"))  # type: ignore[arg-type]
    # The earlier form, deprecated, checks the same.
    with pytest.warns(DeprecationWarning, match=r"transaction=Outbox"), \
            pytest.raises(ConfigurationError, match="RECEIVE_ONLY"):
        Endpoint("atomic").enable_outbox()


async def test_the_same_message_twice_in_a_row_runs_handlers_once(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, optimistic_endpoint)
    await send_duplicates(transport, "payments", 2, reply_to="client")

    await drain(transport, strategy)

    assert await counts(transport) == (1, 1, 1)  # ledger: the send (the delayed one waits)
    assert await transport.depth("client") == 1  # the reply, once
    assert strategy.duplicates == 1
    async with transport.pool.acquire() as connection:
        due = await optimistic_endpoint.delayed_store.next_due_in(connection)  # type: ignore[union-attr]
    assert due is not None  # the delayed send went to the store, once
    assert await transport.pool.fetchval('SELECT count(*) FROM "payments.delayed"') == 1
    record = await transport.pool.fetchrow(
        'SELECT dispatched, dispatched_at, operations FROM "payments_OutboxData"')
    assert record["dispatched"] is True
    assert record["dispatched_at"] is not None
    assert record["operations"] is None


@pytest.mark.parametrize("endpoint", [optimistic_endpoint, pessimistic_endpoint])
async def test_concurrent_duplicates_write_and_dispatch_once(
    transport: PostgresTransport, endpoint: Endpoint
) -> None:
    """Two copies of one message id in flight at once: the first waits in its handler on a
    lock the test holds while the second is received. Pessimistic: the second blocks on the
    first's placeholder record (a wait on the first's transaction) and its body never runs.
    Optimistic: the second's body runs too, and it loses on the record's primary key."""
    strategy = await prepare(transport, endpoint)
    await send_duplicates(transport, endpoint.name, 2, invoice="held")

    async def one_round() -> None:
        async with transport.pool.acquire() as connection:
            slot = strategy.open_slot(connection)
            await slot.round()
            await slot.close()

    async with transport.pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", HELD_INVOICE_LOCK)
        first = asyncio.create_task(one_round())
        await wait_for_waiters(transport, "advisory", 1)  # the first is in its handler
        second = asyncio.create_task(one_round())
        if endpoint is pessimistic_endpoint:
            # Blocked on the placeholder, while the first is still in its handler.
            await wait_for_waiters(transport, "transactionid", 1)
            assert await transport.depth("handler_runs") == 1
        else:
            await wait_for_waiters(transport, "advisory", 2)  # both bodies in the handler
        await holder.execute("SELECT pg_advisory_unlock($1)", HELD_INVOICE_LOCK)
        await asyncio.gather(first, second)
    await drain(transport, strategy)

    payments, ledger, runs = await counts(transport)
    assert (payments, ledger) == (1, 1)
    assert runs == (1 if endpoint is pessimistic_endpoint else 2)
    assert strategy.duplicates == 1


async def wait_for_waiters(
    transport: PostgresTransport, locktype: str, waiting: int, limit_s: float = 10.0
) -> None:
    """Wait until ``waiting`` backends of this test's database wait for a lock of
    ``locktype``; for "transactionid", a wait on the transaction of a backend that waits for
    ``HELD_INVOICE_LOCK`` (the first copy, in its handler)."""
    query = """
        SELECT count(*) FROM pg_locks AS waiter
        JOIN pg_stat_activity AS activity USING (pid)
        WHERE NOT waiter.granted AND waiter.locktype = $1
          AND activity.datname = current_database()
          AND ($1 <> 'transactionid' OR EXISTS (
              SELECT FROM pg_locks AS held
              WHERE NOT held.granted AND held.locktype = 'advisory' AND held.objid = $2
                AND held.pid = ANY (pg_blocking_pids(waiter.pid))))"""
    deadline = asyncio.get_running_loop().time() + limit_s
    while (seen := await transport.pool.fetchval(query, locktype, HELD_INVOICE_LOCK)) < waiting:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{seen} of {waiting} backends wait for a {locktype} lock")
        await asyncio.sleep(0.01)


async def test_record_committed_but_not_dispatched_is_dispatched_on_redelivery(
    transport: PostgresTransport,
) -> None:
    """What a process that dies between the business commit and the dispatch leaves behind."""
    strategy = await prepare(transport, optimistic_endpoint)
    await send_duplicates(transport, "payments", 1)
    async with transport.pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        from endpoint_runtime.transport import receiving

        received = await receiving.receive(connection, optimistic_endpoint.address)
        assert isinstance(received, TransportMessage)
        async with transport.pool.acquire() as business:
            # The business commit; the dispatch, made on the receive connection (this pool's
            # connections keep no prepared statements, so it cannot go with the commit) ...
            collected = BufferedDispatcher(transport.pool, strategy.pipeline.delayed_store)
            unit = OutboxUnit(connection, collected, OpenTransactionConnection(business),
                              business, None)
            await strategy.pipeline.run(received, unit)
            await end_carried_transaction(business)
        await transaction.rollback()  # ... rolls back with the receive: the process died
    assert await counts(transport) == (1, 0, 1)
    assert await transport.depth("payments") == 1

    await drain(transport, strategy)

    assert await counts(transport) == (1, 1, 1)  # dispatched now; the body did not run again
    assert strategy.handler_runs == 1


async def test_cleanup_removes_only_old_dispatched_records_in_batches(
    transport: PostgresTransport,
) -> None:
    await prepare(transport, optimistic_endpoint)
    storage = OutboxStorage.for_settings(optimistic_endpoint.address,
                                         optimistic_endpoint.settings)
    table = storage.table.qualified
    await transport.pool.execute(f"""
        INSERT INTO {table} (message_id, dispatched, dispatched_at, persistence_version)
        SELECT 'old-' || i, true, now() - interval '8 days', 'v' FROM generate_series(1, 25) i;
        INSERT INTO {table} (message_id, dispatched, dispatched_at, persistence_version)
        VALUES ('recent', true, now() - interval '1 day', 'v');
        INSERT INTO {table} (message_id, dispatched, persistence_version, operations)
        VALUES ('pending', false, 'v', '[]')""")
    settings = OutboxSettings(cleanup_batch_size=10)
    cleaner = OutboxCleaner(storage, transport.pool, settings, lambda m, e: None)

    assert await cleaner.clean_once() == 25
    left = await transport.pool.fetch(f"SELECT message_id FROM {table} ORDER BY 1")
    assert [r["message_id"] for r in left] == ["pending", "recent"]


async def test_only_one_instance_cleans_at_a_time(transport: PostgresTransport) -> None:
    await prepare(transport, optimistic_endpoint)
    storage = OutboxStorage.for_settings(optimistic_endpoint.address,
                                         optimistic_endpoint.settings)
    cleaner = OutboxCleaner(storage, transport.pool, OutboxSettings(), lambda m, e: None)
    holder: asyncpg.Connection
    async with transport.pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", storage.lock_key)
        assert await cleaner.clean_once() is None  # another instance is cleaning
        await holder.execute("SELECT pg_advisory_unlock($1)", storage.lock_key)
    assert await cleaner.clean_once() == 0


async def test_the_cleaner_raises_the_critical_error_after_ten_failed_rounds_in_a_row(
    transport: PostgresTransport,
) -> None:
    """A cleanup that fails (its table is gone) raises the critical error at its tenth failed
    round in a row, not before; a round that succeeds starts the count again."""
    await prepare(transport, optimistic_endpoint)
    storage = OutboxStorage.for_settings(optimistic_endpoint.address,
                                         optimistic_endpoint.settings)
    here, away = storage.table.qualified, '"public"."outbox_away"'
    succeeding_rounds = {8, 19}  # every other round finds no table and fails
    rounds = 0
    critical: list[int] = []  # the round of each critical error

    def on_critical_error(message: str, exc: BaseException) -> None:
        assert message == "outbox cleanup failed 10 times in a row"
        critical.append(rounds)

    cleaner = OutboxCleaner(storage, transport.pool, OutboxSettings(cleanup_interval=0.01),
                            on_critical_error)
    clean_once = cleaner.clean_once
    done = asyncio.Event()

    async def one_round() -> int | None:
        nonlocal rounds
        rounds += 1
        if rounds == 30:
            done.set()
            cleaner.stop()
        table_is_here = await transport.pool.fetchval("SELECT to_regclass($1)", here)
        if (rounds in succeeding_rounds) != bool(table_is_here):
            source, name = (away, storage.table.table) if rounds in succeeding_rounds else (
                here, "outbox_away")
            await transport.pool.execute(
                f"ALTER TABLE {source} RENAME TO {quote_identifier(name)}")
        return await clean_once()

    cleaner.clean_once = one_round  # type: ignore[method-assign]
    await transport.pool.execute(f"ALTER TABLE {here} RENAME TO outbox_away")
    await asyncio.wait_for(cleaner.run(), timeout=30)
    assert done.is_set()
    # Rounds 1-7 fail, 8 succeeds, 9-18 fail (ten in a row), 19 succeeds, 20-29 fail.
    assert critical == [18, 29]


async def test_outbox_reply_and_delayed_send_keep_their_headers(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, optimistic_endpoint)
    await send_duplicates(transport, "payments", 1, reply_to="client")
    before = await transport.pool.fetchval("SELECT clock_timestamp()")
    await drain(transport, strategy)
    after = await transport.pool.fetchval("SELECT clock_timestamp()")
    reply = await transport.receive("client")
    assert isinstance(reply, TransportMessage)
    assert reply.headers[Headers.MESSAGE_INTENT] == "Reply"
    delayed = await transport.pool.fetchrow('SELECT due, headers FROM "payments.delayed"')
    # The handler asked for delay=0.5 s while it ran, between `before` and `after`.
    assert before + timedelta(seconds=0.5) <= delayed["due"] <= after + timedelta(seconds=0.5)
    assert Headers.DELIVER_AT in delayed["headers"]


async def test_a_message_id_with_quotes_goes_through_the_outbox(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, optimistic_endpoint)
    odd_id = "order-7'); DELETE FROM paid_invoices; --"
    for _ in range(2):
        await transport.send("payments", create_outgoing(
            PayInvoice("inv-q"), headers={Headers.MESSAGE_ID: odd_id}))

    await drain(transport, strategy)

    assert await counts(transport) == (1, 1, 1)
    stored = await transport.pool.fetchval('SELECT message_id FROM "payments_OutboxData"')
    assert stored == odd_id


async def test_the_receive_says_whether_the_message_id_is_recorded(
    transport: PostgresTransport,
) -> None:
    """Optimistic mode looks the message id up in the receive's own round trip, when the
    headers carry it in this runtime's form; otherwise it looks up on the business side."""
    strategy = await prepare(transport, optimistic_endpoint)
    known, fresh, odd = str(uuid.uuid4()), str(uuid.uuid4()), 'quoted "id" \\ here'
    for message_id in (known, known, fresh, odd):
        await transport.send("payments", create_outgoing(
            PayInvoice(message_id), headers={Headers.MESSAGE_ID: message_id}))
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert (await slot.round()).handled == 1  # records `known`
        found = {}
        for _ in range(3):
            message, recorded = await strategy._receive(connection,
                                                         optimistic_endpoint.address)
            assert isinstance(message, TransportMessage)
            found[message.message_id] = recorded
        await slot.close()

    assert found == {known: True, fresh: False, odd: None}  # odd: JSON-escaped in the headers


async def test_only_the_receive_transaction_commits_without_waiting_for_the_flush(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport, optimistic_endpoint)
    await send_duplicates(transport, "payments", 1)
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert (await slot.round()).handled == 1
        business = slot.business
        assert business is not None
        assert await connection.fetchval("SHOW synchronous_commit") == "off"
        assert await business.fetchval("SHOW synchronous_commit") == "on"
        await slot.close()


async def test_synchronous_acks_make_the_receive_transaction_wait_for_the_flush(
    transport: PostgresTransport,
) -> None:
    """OutboxSettings(synchronous_acks=True): the receive transaction keeps the server's
    synchronous_commit, as the business transaction does."""
    endpoint = make("payments", synchronous_acks=True)
    strategy = await prepare(transport, endpoint)
    await send_duplicates(transport, "payments", 1)
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert (await slot.round()).handled == 1
        assert await connection.fetchval("SHOW synchronous_commit") == "on"
        await slot.close()
    assert await counts(transport) == (1, 1, 1)
