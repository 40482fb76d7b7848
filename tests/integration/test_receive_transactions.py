"""The receive transaction's round trips: COMMIT chained with the next BEGIN, and outgoing
messages sent as prepared statements together with the COMMIT (atomic mode, no Ray)."""

from __future__ import annotations

import asyncpg
import msgspec

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transactions.base import Round
from endpoint_runtime.transactions.single import SingleMessageStrategy
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import Headers, TransportMessage
from tests.support.atomic_endpoints import Done, Job, ledger
from tests.support.expiry import send_expiring, wait_until_expired


async def prepare(transport: PostgresTransport) -> SingleMessageStrategy:
    for queue in ("ledger_in", "ledger_out", "error"):
        await transport.create_queue(queue)
    await transport.pool.execute("""
        CREATE TABLE ledger_rows (n integer);
        CREATE TABLE ledger_parents (id integer PRIMARY KEY);
        CREATE TABLE ledger_children (
            parent integer REFERENCES ledger_parents (id) DEFERRABLE INITIALLY DEFERRED);
    """)
    strategy = ledger.create_strategy(ledger.create_pipeline(), transport.pool, ledger.settings)
    assert isinstance(strategy, SingleMessageStrategy)
    return strategy


async def run_job(
    transport: PostgresTransport, strategy: SingleMessageStrategy, job: Job, *rounds: Round
) -> None:
    """Send ``job``, run one receive round per expected result, then end the slot."""
    await transport.send("ledger_in", create_outgoing(job))
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        for expected in rounds:
            assert await slot.round() == expected
        await slot.close()


async def bodies(transport: PostgresTransport, queue: str) -> list[Done]:
    address = transport.address(queue)
    rows = await transport.pool.fetch(f"SELECT body FROM {address.qualified} ORDER BY seq")
    return [msgspec.json.decode(row["body"], type=Done) for row in rows]


async def test_a_handled_message_begins_the_next_transaction_and_the_slot_end_closes_it(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport)
    for n in range(3):
        await transport.send("ledger_in", create_outgoing(Job(n)))

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        for _ in range(3):
            assert await slot.round() == Round(taken=1, handled=1)
            assert connection.is_in_transaction()  # COMMIT; BEGIN: the next one is open
            # ...and committed: another connection sees the sends and the emptier queue.
        assert await transport.depth("ledger_out") == 3
        assert await transport.depth("ledger_in") == 0
        assert await slot.round() == Round()
        assert not connection.is_in_transaction()  # an empty receive commits, begins nothing

        await transport.send("ledger_in", create_outgoing(Job(3)))
        await slot.round()
        assert connection.is_in_transaction()
        await slot.close()
        assert not connection.is_in_transaction()

    assert [done.n for done in await bodies(transport, "ledger_out")] == [0, 1, 2, 3]


async def test_a_message_that_expires_in_the_carried_transaction_is_not_handled(
    transport: PostgresTransport,
) -> None:
    """The COMMIT of one message begins the next receive's transaction; a message that
    expires after that BEGIN, before the receive, is deleted and never handled."""
    strategy = await prepare(transport)
    await transport.send("ledger_in", create_outgoing(Job(1)))
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        assert await slot.round() == Round(taken=1, handled=1)
        assert connection.is_in_transaction()  # carried: it began with the COMMIT
        await send_expiring(transport, "ledger_in", Job(2))
        await transport.send("ledger_in", create_outgoing(Job(3)))
        await wait_until_expired(transport, "ledger_in", count=1)

        assert await slot.round() == Round(taken=1, handled=1)
        await slot.close()

    assert [done.n for done in await bodies(transport, "ledger_out")] == [1, 3]
    assert await transport.depth("ledger_in") == 0


async def test_sends_travel_as_one_prepared_statement_per_session_and_queue(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport)
    outgoing = [create_outgoing(Job(n)) for n in range(5)]
    for message in outgoing:
        await transport.send("ledger_in", message)

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        while (await slot.round()).taken:
            pass
        prepared = await connection.fetchval(
            "SELECT count(*) FROM pg_prepared_statements WHERE from_sql "
            "AND statement LIKE '%\"public\".\"ledger_out\"%'")
    assert prepared == 1  # prepared once (SQL PREPARE), executed five times
    rows = await transport.pool.fetch(
        'SELECT headers, body, expires FROM "public"."ledger_out" ORDER BY seq')
    assert [msgspec.json.decode(row["body"], type=Done).n for row in rows] == list(range(5))
    for row, incoming in zip(rows, outgoing, strict=True):
        headers = msgspec.json.decode(row["headers"])
        # The handler's send carries the incoming message's conversation, like any send.
        assert headers[Headers.CONVERSATION_ID] == incoming.headers[Headers.CONVERSATION_ID]
        assert headers[Headers.ENCLOSED_MESSAGE_TYPES].endswith("Done")
        assert row["expires"] is None


async def test_a_handler_savepoint_inside_the_chained_transaction(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport)
    await transport.send("ledger_in", create_outgoing(Job(7, "savepoint")))
    await transport.send("ledger_in", create_outgoing(Job(8, "savepoint")))

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        for _ in range(2):  # the second runs in the transaction the first one began
            assert await slot.round() == Round(taken=1, handled=1)
        await slot.close()

    assert await transport.pool.fetchval("SELECT array_agg(n ORDER BY n) FROM ledger_rows") \
        == [7, 8]
    assert await transport.depth("ledger_out") == 2


async def test_a_commit_that_fails_undoes_the_receive_and_the_sends(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport)
    await transport.send("ledger_in", create_outgoing(Job(1, "deferred_violation")))
    await transport.send("ledger_in", create_outgoing(Job(2)))

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        failed = await slot.round()
        assert failed == Round(taken=1, failed=1)
        assert not connection.is_in_transaction()
        # No retries configured: the next round moves it to the error queue, in order.
        assert await slot.round() == Round(taken=1, failed=1)
        assert await slot.round() == Round(taken=1, handled=1)
        await slot.close()

    assert [done.n for done in await bodies(transport, "ledger_out")] == [2]
    assert await transport.pool.fetchval("SELECT count(*) FROM ledger_children") == 0
    error = await transport.receive("error")
    assert isinstance(error, TransportMessage)
    assert "ForeignKeyViolation" in error.headers[ErrorHeaders.EXCEPTION_TYPE]


async def test_a_send_to_a_missing_queue_fails_with_a_clear_error(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport)
    failed = Round(taken=1, failed=1)  # no retries: the second round moves it on
    await run_job(transport, strategy, Job(1, "missing_queue"), failed, failed)

    error = await transport.receive("error")
    assert isinstance(error, TransportMessage)
    assert error.headers[ErrorHeaders.EXCEPTION_TYPE].endswith("QueueNotFoundError")
    assert "nowhere" in error.headers[ErrorHeaders.MESSAGE]


async def test_a_large_message_goes_as_parameters_and_keeps_the_order(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport)
    size = sending.STATEMENT_SIZE_LIMIT + 1
    await run_job(transport, strategy, Job(10, "large_first", size), Round(taken=1, handled=1))

    sent = await bodies(transport, "ledger_out")
    assert [(done.n, len(done.padding)) for done in sent] == [(10, size), (11, 0)]


async def test_send_statement_is_prepared_where_the_connection_tracks_its_statements(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    """A connection that tracks its session's statements gets ``EXECUTE`` of a prepared
    INSERT; any other (a plain connection, one behind a transaction-mode pooler) gets the
    INSERT with the values written in, which prepares nothing in its session."""
    address = await transport.create_queue("ledger_out")
    message = create_outgoing(Done(1))
    plain = await asyncpg.connect(database_dsn)
    try:
        inline = await sending.send_statement(plain, address, message)
        assert inline is not None
        assert inline.startswith("INSERT INTO")
        await plain.execute(inline)
        assert await plain.fetchval(
            "SELECT count(*) FROM pg_prepared_statements WHERE from_sql") == 0
    finally:
        await plain.close()
    inlined = await transport.receive("ledger_out")
    assert isinstance(inlined, TransportMessage)
    assert inlined.headers == message.headers
    assert inlined.body == message.body

    async with transport.pool.acquire() as connection:  # the transport's pools track them
        statement = await sending.send_statement(connection, address, message)
        assert statement is not None
        again = await sending.send_statement(connection, QueueAddress("ledger_out"), message)
        assert again == statement
        await connection.execute(statement)
        # The statement runs a session-prepared INSERT, prepared once for the queue.
        assert await connection.fetchval(
            "SELECT count(*) FROM pg_prepared_statements WHERE from_sql "
            "AND statement LIKE '%\"public\".\"ledger_out\"%'") == 1
    received = await transport.receive("ledger_out")
    assert isinstance(received, TransportMessage)
    assert received.headers == message.headers
    assert received.body == message.body


async def seconds_to_expiry(transport: PostgresTransport) -> float:
    left = await transport.pool.fetchval(
        "SELECT extract(epoch FROM expires - (now() AT TIME ZONE 'UTC'))::float8 "
        'FROM "public"."ledger_out"')
    assert isinstance(left, float)
    return left


async def test_a_send_with_time_to_be_received_sets_expires_through_the_statement(
    transport: PostgresTransport,
) -> None:
    strategy = await prepare(transport)
    await run_job(transport, strategy, Job(5, "expiring"), Round(taken=1, handled=1))

    left = await seconds_to_expiry(transport)
    assert 85 < left <= 90.5


async def test_time_to_be_received_counts_from_the_send_not_from_the_transaction_start(
    transport: PostgresTransport,
) -> None:
    """The handler sleeps 2 s and then sends with a 5 s time to be received: the message
    must have about 5 s left when it is committed, not 3 (now() is the transaction's start)."""
    strategy = await prepare(transport)
    await run_job(transport, strategy, Job(6, "slow_expiring"), Round(taken=1, handled=1))

    left = await seconds_to_expiry(transport)
    assert 4.0 < left <= 5.0


async def test_a_batch_that_cannot_commit_rolls_back_and_its_messages_go_one_by_one(
    transport: PostgresTransport,
) -> None:
    """With a savepoint per message: one message of the batch breaks a deferred constraint,
    the batch's COMMIT fails, the batch rolls back whole, and the next rounds take its
    messages one at a time, so that only that message fails. (Optimistic batches find it
    before the COMMIT: tests/integration/test_optimistic_batches.py.)"""
    from tests.support.atomic_endpoints import ledger_batched_savepoints as endpoint

    await prepare(transport)
    await transport.create_queue(endpoint.name)
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), transport.pool,
                                        endpoint.settings)
    for job in (Job(1), Job(2, "deferred_violation"), Job(3)):
        await transport.send(endpoint.name, create_outgoing(job))

    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        # The batch rolls back whole and, in the same round, its first message goes alone (a
        # round that raised would end the slot in a receiver, and its one-by-one rounds too).
        assert await slot.round() == Round(taken=1, handled=1)
        assert await transport.depth(endpoint.name) == 2
        while (await slot.round()).taken:
            pass
        await slot.close()

    assert sorted(done.n for done in await bodies(transport, "ledger_out")) == [1, 3]
    assert await transport.depth("error") == 1
