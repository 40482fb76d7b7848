"""A receive skips the rows other receives hold (``FOR UPDATE SKIP LOCKED``), on a real server.

Competing receivers share one queue table. A receive that waited on the row an in-flight
receive holds (its handler still running, its transaction open) would line every receiver up
behind the slowest handler, and nothing else would show it: the messages would still each be
received once, only one at a time. So one connection takes the lowest rows and keeps its
transaction open, and a second connection's receive must return the next rows at once.

The second receive runs with a ``lock_timeout``: a receive that waits on the held rows fails
with ``LockNotAvailableError`` after it, instead of hanging until the test's timeout. Every
statement that takes rows is checked: ``receive_past`` (the runtime's receive, and the outbox's
receive built on it), ``receive_batch`` and the plain ``receive`` (the benchmarks' baseline).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import asyncpg
import msgspec
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress, receiving, statements
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.wire.messages import TransportMessage

LOCK_TIMEOUT_MS = 2000
"""How long the second receive may wait on a lock before the server gives up: far longer
than a receive that skips the held rows takes, short enough for a failing test to end soon."""

HELD = 2
"""Rows the first receive holds (a batch takes them all; the single receives the lowest)."""


class Numbered(msgspec.Struct):
    n: int


Receive = Callable[[DatabaseConnection, QueueAddress], Awaitable[list[int]]]


def numbers(messages: list[object]) -> list[int]:
    """The ``n`` of each received message, in the order received."""
    taken = []
    for message in messages:
        assert isinstance(message, TransportMessage)
        taken.append(msgspec.json.decode(message.body, type=Numbered).n)
    return taken


async def receive_past(connection: DatabaseConnection, address: QueueAddress) -> list[int]:
    message = await receiving.receive(connection, address)
    return numbers([message] if message is not None else [])


async def receive_batch(connection: DatabaseConnection, address: QueueAddress) -> list[int]:
    return numbers(list(await receiving.receive_batch(connection, address, HELD)))


async def plain_receive(connection: DatabaseConnection, address: QueueAddress) -> list[int]:
    row = await connection.fetchrow(statements.for_queue(address)["receive"])
    return numbers([receiving.to_message(row)] if row is not None else [])


RECEIVES: dict[str, tuple[Receive, list[int], list[int]]] = {
    # name: (the receive, what the first takes and holds, what the second must get at once)
    "receive_past": (receive_past, [0], [1]),
    "receive_batch": (receive_batch, [0, 1], [2, 3]),
    "receive": (plain_receive, [0], [1]),
}


@pytest.mark.parametrize("name", list(RECEIVES))
async def test_a_receive_skips_the_rows_an_open_receive_holds_instead_of_waiting(
    transport: PostgresTransport, name: str,
) -> None:
    receive, held, next_rows = RECEIVES[name]
    address = await transport.create_queue("competing")
    await transport.send_many(address, [create_outgoing(Numbered(n)) for n in range(6)])

    async with transport.pool.acquire() as first, transport.pool.acquire() as second:
        holding = first.transaction()
        await holding.start()  # a handler still running: its rows stay locked
        try:
            assert await receive(first, address) == held
            async with second.transaction():
                await second.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                started = time.monotonic()
                try:
                    taken = await receive(second, address)
                except asyncpg.LockNotAvailableError:
                    pytest.fail(f"{name} waited {LOCK_TIMEOUT_MS} ms on the rows another "
                                "receive holds instead of skipping them (SKIP LOCKED)")
                waited = time.monotonic() - started
        finally:
            await holding.rollback()  # the held rows go back to the queue

    assert taken == next_rows, f"{name} took {taken} past the held rows {held}"
    assert waited < LOCK_TIMEOUT_MS / 1000, f"{name} took {waited:.2f} s"
    # The rolled-back rows are there again, first in line.
    async with transport.pool.acquire() as third, third.transaction():
        assert await receive(third, address) == held
