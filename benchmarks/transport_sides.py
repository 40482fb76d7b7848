"""The two sides of the transport benchmark: what ours and raw do per message.

Review this module for fairness: both sides get the same messages (built before timing), the
same SQL text, and do the same work around it; only the code between loop and asyncpg differs.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import msgspec

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.transport import receiving, sending, statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import OutgoingMessage

Worker = Callable[[asyncpg.Connection], Awaitable[int]]
RawRow = tuple[uuid.UUID, str, bytes]

_raw_headers = msgspec.json.Decoder(dict[str, str])


class PlaceOrder(msgspec.Struct):
    """The benchmark's message: a typical small command."""

    __message_type_name__ = "Benchmarks.Messages.PlaceOrder"
    order_id: str
    customer_id: str
    quantity: int
    amount: float
    lines: list[str]


class Workload(msgspec.Struct, frozen=True):
    """The same messages twice: as OutgoingMessage for ours, pre-encoded rows for raw."""

    outgoing: list[OutgoingMessage]
    raw_rows: list[RawRow]

    def head(self, count: int) -> Workload:
        """The first ``count`` messages (for the warm-up)."""
        return Workload(self.outgoing[:count], self.raw_rows[:count])


def build_workload(count: int) -> Workload:
    """Build ``count`` messages before any timing starts.

    Args:
        count: Number of messages.

    Returns:
        The workload; raw rows carry the same id, header JSON text and body bytes.
    """
    outgoing = [
        create_outgoing(
            PlaceOrder(
                f"order-{i}",
                f"customer-{i % 97}",
                i % 7 + 1,
                12.5 * (i % 13),
                [f"sku-{i % 31}", f"sku-{i % 17}"],
            ),
            originating_endpoint="benchmark",
        )
        for i in range(count)
    ]
    raw_rows = [
        (uuid.UUID(m.message_id), msgspec.json.encode(m.headers).decode(), m.body) for m in outgoing
    ]
    return Workload(outgoing, raw_rows)


def send_worker(side: str, address: QueueAddress, workload: Workload) -> Worker:
    """A worker that sends until the supply shared by all workers of the phase is used up.

    Args:
        side: ``"ours"`` (``sending.send``) or ``"raw"`` (``connection.execute``).
        address: The side's queue.
        workload: The messages; each worker takes the next one from one shared iterator.

    Returns:
        A coroutine function of a connection that returns how many messages it sent.
    """
    if side == "ours":
        messages = iter(workload.outgoing)

        async def ours(connection: asyncpg.Connection) -> int:
            sent = 0
            for message in messages:
                await sending.send(connection, address, message)
                sent += 1
            return sent

        return ours
    statement = statements.for_queue(address)["send"]
    rows = iter(workload.raw_rows)

    async def raw(connection: asyncpg.Connection) -> int:
        sent = 0
        for native_id, headers, body in rows:
            await connection.execute(statement, native_id, None, headers, body)
            sent += 1
        return sent

    return raw


def receive_worker(side: str, address: QueueAddress) -> Worker:
    """A worker that receives, one transaction per message, until the queue is empty.

    Args:
        side: ``"ours"`` (``receiving.receive``) or ``"raw"`` (``connection.fetchrow`` of the
            same ``receive_past`` statement and a msgspec decode of the headers into
            ``dict[str, str]``).
        address: The side's queue.

    Returns:
        A coroutine function of a connection that returns how many messages it received.
    """
    if side == "ours":

        async def ours(connection: asyncpg.Connection) -> int:
            received = 0
            while True:
                async with connection.transaction():
                    message = await receiving.receive(connection, address)
                if message is None:
                    return received
                received += 1

        return ours
    # The statement ours runs (``receive_past``), with the position a hand-written loop would
    # keep the same way: past the seq taken last, minus one; 0 (from the start) at first and
    # after an empty receive. Ours also scans from the start once a second
    # (``receiving.FULL_SCAN_INTERVAL``): one receive in thousands here.
    statement = statements.for_queue(address)["receive_past"]

    async def raw(connection: asyncpg.Connection) -> int:
        received = 0
        position = 0
        while True:
            async with connection.transaction():
                row = await connection.fetchrow(statement, position)
                if row is not None:
                    _raw_headers.decode(row["headers"])
            if row is None:
                return received
            position = row["seq"] - 1
            received += 1

    return raw
