"""Receives start past the connection's last taken seq (``receive_past``), on a real server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable

import asyncpg
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress, receiving, statements
from endpoint_runtime.wire.messages import TransportMessage
from tests.integration.test_transport import OrderPlaced

TAKEN = 200


async def take(connection: asyncpg.Connection, address: QueueAddress) -> int:
    """Receive one message in its own committed transaction; its seq."""
    async with connection.transaction():
        message = await receiving.receive(connection, address)
    assert isinstance(message, TransportMessage)
    return message.seq


async def entries_read(connection: asyncpg.Connection, address: QueueAddress,
                       receive: Awaitable[object]) -> int:
    """Entries of the queue's seq index that ``receive`` reads (its transaction rolled back)."""
    index = f'"{address.schema}"."{address.derived_name("_seq_idx")}"'
    counter = "SELECT pg_stat_get_xact_tuples_returned(to_regclass($1))"
    transaction = connection.transaction()
    await transaction.start()
    try:
        # The counter also holds earlier transactions' reads not yet flushed to the
        # statistics: the difference is this receive's.
        before: int = await connection.fetchval(counter, index)
        await receive
        after: int = await connection.fetchval(counter, index)
    finally:
        await transaction.rollback()
    return after - before


def hold_off_full_scan(connection: asyncpg.Connection, address: QueueAddress) -> None:
    """The next receive starts from the position (a slow machine must not make the scan from
    the start come due in the middle of a test)."""
    position = receiving.receive_position(connection, address)
    assert position is not None
    position.full_scan_due = time.monotonic() + 60


@contextlib.asynccontextmanager
async def rolled_back_below_the_position(
    transport: PostgresTransport, queue: str, messages: int
) -> AsyncIterator[tuple[asyncpg.Connection, QueueAddress, TransportMessage, list[int]]]:
    """A queue of ``messages``; one connection receives the first while the receiver takes
    the next two, then rolls back: its message is back, below the receiver's position.
    Yields (receiver, queue address, the message rolled back, the two seqs taken)."""
    address = await transport.create_queue(queue)
    await transport.send_many(address, [create_outgoing(OrderPlaced(i)) for i in range(messages)])
    async with transport.pool.acquire() as holder, transport.pool.acquire() as receiver:
        transaction = holder.transaction()
        await transaction.start()
        held = await receiving.receive(holder, address)
        taken = [await take(receiver, address), await take(receiver, address)]
        await transaction.rollback()
        assert isinstance(held, TransportMessage)
        assert held.seq < taken[0] < taken[1]
        yield receiver, address, held, taken


def receive_some(connection: asyncpg.Connection, address: QueueAddress,
                 batch: int) -> Awaitable[object]:
    if batch == 1:
        return receiving.receive(connection, address)
    return receiving.receive_batch(connection, address, batch)


@pytest.mark.parametrize("batch", [1, 10])
async def test_a_receive_does_not_step_over_rows_deleted_under_an_old_snapshot(
    transport: PostgresTransport, batch: int,
) -> None:
    address = await transport.create_queue("busy")
    await transport.send_many(address, [create_outgoing(OrderPlaced(i)) for i in range(300)])
    async with transport.pool.acquire() as reporter, transport.pool.acquire() as receiver:
        # A long transaction elsewhere (a report, a backup): rows deleted after its snapshot
        # stay in the index for every scan, until it ends.
        await reporter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await reporter.fetchval(f"SELECT count(*) FROM {address.qualified}")
        for _ in range(TAKEN // batch):
            async with receiver.transaction():
                await receive_some(receiver, address, batch)

        hold_off_full_scan(receiver, address)
        from_position = await entries_read(receiver, address,
                                           receive_some(receiver, address, batch))
        plain = statements.for_queue(address)["receive"]
        from_start = await entries_read(receiver, address, receiver.fetchrow(plain))
        await reporter.execute("ROLLBACK")

    assert from_start > TAKEN  # the dead entries are there for a scan from the start
    # From the position: the last batch taken (the position is at its first seq), the batch
    # taken now, and the DELETE finding each of those by seq.
    assert from_position <= 3 * batch


async def test_a_message_rolled_back_below_the_position_is_received_within_a_second(
    transport: PostgresTransport,
) -> None:
    async with rolled_back_below_the_position(transport, "rolled_back", 6) as (
        receiver, address, held, taken,
    ):
        # Past its position the receiver finds the next message first...
        hold_off_full_scan(receiver, address)
        assert await take(receiver, address) == taken[1] + 1
        # ...and the scan from the start, due once a second, finds the one rolled back.
        position = receiving.receive_position(receiver, address)
        assert position is not None
        position.full_scan_due = time.monotonic() + receiving.FULL_SCAN_INTERVAL
        deadline = time.monotonic() + 3 * receiving.FULL_SCAN_INTERVAL
        while time.monotonic() < position.full_scan_due:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await take(receiver, address) == held.seq


async def test_a_connection_scans_from_the_start_once_a_second_by_itself(
    transport: PostgresTransport,
) -> None:
    """Nobody touches the schedule: the connection's first receive scans from the start and
    the next scan comes due FULL_SCAN_INTERVAL later. A message rolled back below the
    position is found by that scan, while plenty still lies past the position (receives
    paced at 20 ms: 400 messages last 8 s), and not before it (the position is used)."""
    address = await transport.create_queue("paced")
    await transport.send_many(address, [create_outgoing(OrderPlaced(i)) for i in range(400)])
    async with transport.pool.acquire() as holder, transport.pool.acquire() as receiver:
        transaction = holder.transaction()
        await transaction.start()
        held = await receiving.receive(holder, address)
        assert isinstance(held, TransportMessage)
        first_receive = time.monotonic()  # before the first receive sets the schedule
        taken = [await take(receiver, address), await take(receiver, address)]
        await transaction.rollback()  # held is back, below the receiver's position
        assert held.seq < taken[0]
        while (seq := await take(receiver, address)) != held.seq:
            assert seq > taken[-1]
            taken.append(seq)
            await asyncio.sleep(0.02)
        found_after = time.monotonic() - first_receive
    assert found_after >= receiving.FULL_SCAN_INTERVAL, "a receive scanned from the start early"
    # The claim is once a second: the next scan is due 1 s after the first receive; 2 s of
    # margin for a loaded machine, far below the 8 s until nothing is left past the position.
    assert found_after < 1.0 + 2.0, found_after
    assert len(taken) < 350


async def test_with_nothing_past_its_position_a_receive_scans_from_the_start(
    transport: PostgresTransport,
) -> None:
    async with rolled_back_below_the_position(transport, "fallback", 3) as (
        receiver, address, held, _,
    ):
        hold_off_full_scan(receiver, address)
        assert await take(receiver, address) == held.seq  # nothing past: from the start
        async with receiver.transaction():
            assert await receiving.receive(receiver, address) is None


@pytest.mark.parametrize("batch", [1, 3])
async def test_a_connection_finds_its_own_rolled_back_messages_again_first(
    transport: PostgresTransport, batch: int,
) -> None:
    address = await transport.create_queue("own_rollback")
    await transport.send_many(address, [create_outgoing(OrderPlaced(i)) for i in range(9)])
    async with transport.pool.acquire() as receiver:
        first = await take(receiver, address)

        async def seqs() -> list[int]:
            received = await receive_some(receiver, address, batch)
            messages = received if isinstance(received, list) else [received]
            return [m.seq for m in messages if isinstance(m, TransportMessage)]

        transaction = receiver.transaction()
        await transaction.start()
        failed = await seqs()  # a handler fails: rolled back
        await transaction.rollback()
        assert len(failed) == batch
        assert min(failed) > first
        # Not a scan from the start (that would find them whatever the position).
        hold_off_full_scan(receiver, address)
        async with receiver.transaction():
            assert await seqs() == failed
