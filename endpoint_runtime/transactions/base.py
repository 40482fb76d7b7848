"""What every transaction strategy shares: the round result and the outgoing dispatchers."""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

import asyncpg
import msgspec

from endpoint_runtime.messages import OutgoingMessage
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress


class Round(msgspec.Struct):
    """What one receive round did: messages taken off the queue and how they ended."""

    taken: int = 0
    handled: int = 0
    failed: int = 0


EMPTY = Round()


class ReceiveStrategy(Protocol):
    """Receives and processes one message (or one batch) in the mode's transaction shape.

    The connection belongs to the calling receive slot for its whole life: releasing a
    connection to an asyncpg pool costs a reset round trip, too much to pay per message.
    """

    async def receive_round(self, connection: asyncpg.Connection) -> Round: ...


class ImmediateDispatcher:
    """Each outgoing message is inserted at once, in its own transaction on the pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def dispatch(
        self, address: QueueAddress, message: OutgoingMessage, *, immediate: bool
    ) -> None:
        await sending.send(self._pool, address, message)


class BufferedDispatcher:
    """Outgoing messages wait in memory and are written by :meth:`flush`, in the receive
    transaction, one round trip per destination queue. ``immediate=True`` bypasses it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.pending: list[tuple[QueueAddress, OutgoingMessage]] = []

    async def dispatch(
        self, address: QueueAddress, message: OutgoingMessage, *, immediate: bool
    ) -> None:
        if immediate:
            await sending.send(self._pool, address, message)
        else:
            self.pending.append((address, message))

    async def flush(self, connection: asyncpg.Connection) -> None:
        by_queue: dict[QueueAddress, list[OutgoingMessage]] = defaultdict(list)
        for address, message in self.pending:
            by_queue[address].append(message)
        for address, messages in by_queue.items():
            await sending.send_many(connection, address, messages)
        self.pending.clear()
