"""What every transaction strategy shares: the round result, the receive slot and the outgoing
dispatchers."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Protocol, Self

import asyncpg
import msgspec

from endpoint_runtime.chain.outgoing import as_delayed
from endpoint_runtime.delayed.store import DelayedMessage, DelayedMessageStore
from endpoint_runtime.transactions.counting import NO_COUNTS, SlotCounts
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import (
    DatabaseConnection,
    pooled,
    raise_as_loss_if_lost,
)
from endpoint_runtime.wire.messages import OutgoingMessage


class Round(msgspec.Struct):
    """What one receive round did: messages taken off the queue and how they ended."""

    taken: int = 0
    handled: int = 0
    failed: int = 0


EMPTY = Round()


class ReceiveSlot:
    """One receive slot: its connection and what the mode keeps for it between rounds.

    A strategy opens one per slot (:meth:`ReceiveStrategy.open_slot`); the slot's rounds run
    on that connection for the slot's whole life (releasing a connection to an asyncpg pool
    costs a reset round trip, too much to pay per message). :meth:`close` releases what the
    slot kept (a transaction carried over, acks waiting, a second connection); it runs once,
    however often it is called. ``counts`` is the slot's row of committed counts
    (``transactions.counting``; set by the receiver with :meth:`count_with`), written with the
    commits of the work it counts.

    Example::

        async with strategy.open_slot(connection) as slot:
            while (await slot.round()).taken:
                pass
    """

    def __init__(self, connection: DatabaseConnection) -> None:
        self.connection = connection
        self.counts: SlotCounts = NO_COUNTS
        self._closed = False

    def count_with(self, counts: SlotCounts) -> None:
        """Count this slot's committed messages in ``counts``' row from now on."""
        self.counts = counts

    async def round(self) -> Round:
        """Receive one message (or one batch) and process it in the mode's transaction."""
        raise NotImplementedError

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.release()

    async def release(self) -> None:
        """What :meth:`close` does, once: nothing unless the mode keeps something."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class ReceiveStrategy(Protocol):
    """A transaction mode's shape of the receive: opens a :class:`ReceiveSlot` per slot."""

    def open_slot(self, connection: DatabaseConnection) -> ReceiveSlot: ...


class ImmediateDispatcher:
    """Each outgoing message is written at once, in its own transaction on the pool (a
    connection lost on its way back after the write does not fail the send: ``pooled``)."""

    def __init__(self, pool: asyncpg.Pool, store: DelayedMessageStore | None) -> None:
        self._pool = pool
        self._store = store
        self.can_defer = store is not None

    async def dispatch(
        self, address: QueueAddress, message: OutgoingMessage, *, immediate: bool,
        due: datetime | None = None,
    ) -> None:
        async with pooled(self._pool) as connection:
            try:
                if due is None:
                    await sending.send(connection, address, message)
                else:
                    assert self._store is not None
                    await self._store.store(connection, as_delayed(address, message, due))
            except asyncpg.InternalClientError as exc:
                await raise_as_loss_if_lost(connection, exc, f"a send to {address}")


class BufferedDispatcher:
    """Outgoing messages wait in memory and are written by :meth:`flush`, in the receive
    transaction, one round trip per destination queue. ``immediate=True`` bypasses it."""

    def __init__(self, pool: asyncpg.Pool, store: DelayedMessageStore | None) -> None:
        self._immediate = ImmediateDispatcher(pool, store)
        self._store = store
        self.can_defer = store is not None
        self.pending: list[tuple[QueueAddress, OutgoingMessage]] = []
        self.pending_delayed: list[DelayedMessage] = []

    async def dispatch(
        self, address: QueueAddress, message: OutgoingMessage, *, immediate: bool,
        due: datetime | None = None,
    ) -> None:
        if immediate:
            await self._immediate.dispatch(address, message, immediate=True, due=due)
        elif due is not None:
            self.pending_delayed.append(as_delayed(address, message, due))
        else:
            self.pending.append((address, message))

    def take_from(self, other: BufferedDispatcher) -> None:
        self.pending.extend(other.pending)
        self.pending_delayed.extend(other.pending_delayed)

    async def flush_before_commit(self, connection: DatabaseConnection) -> str:
        """Like :meth:`flush`, but the messages are not written now: they come back as
        statements to send with the COMMIT, in one simple query (a round trip saved). If any
        message cannot go that way, all are written now, so that the messages to one queue
        keep their order; the result is then empty."""
        sends = []
        for address, message in self.pending:
            statement = await sending.send_statement(connection, address, message)
            if statement is None:
                await self.flush(connection)
                return ""
            sends.append(statement)
        self.pending.clear()
        if self.pending_delayed:
            await self.flush(connection)
        return "; ".join(sends)

    async def flush(self, connection: DatabaseConnection) -> None:
        if len(self.pending) == 1 and not self.pending_delayed:  # the common case
            address, message = self.pending[0]
            await sending.send(connection, address, message)
            self.pending.clear()
            return
        by_queue: dict[QueueAddress, list[OutgoingMessage]] = defaultdict(list)
        for address, message in self.pending:
            by_queue[address].append(message)
        for address, messages in by_queue.items():
            await sending.send_many(connection, address, messages)
        if self.pending_delayed:
            assert self._store is not None
            for delayed in self.pending_delayed:
                await self._store.store(connection, delayed)
        self.pending.clear()
        self.pending_delayed.clear()
