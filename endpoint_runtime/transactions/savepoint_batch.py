"""Batches with a savepoint per message (``batch_isolation="savepoint"``).

Each message of the batch whose handlers use the database gets a savepoint, taken on that
first use; a failed message's work rolls back to it, its outgoing messages are dropped and its
row is put back with its seq. A handled message's savepoint stays open until the next one is
needed: ``RELEASE SAVEPOINT; SAVEPOINT`` then go as one simple query (one round trip per message
instead of two). A RELEASE that fails (the handler caught a database error without a savepoint
of its own, the transaction is aborted) charges that message: its work rolls back to its
savepoint, which then serves the next message. Recoverability's moves never run inside another
message's open savepoint: it is released before their first statement.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

import asyncpg

from endpoint_runtime.chain.pipeline import IncomingContext, Outcome, Pipeline, Unit
from endpoint_runtime.transactions.base import BufferedDispatcher, Round
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.savepoints import (
    LazySavepointConnection,
    OpenTransactionConnection,
)
from endpoint_runtime.wire.messages import PoisonMessage, TransportMessage

MESSAGE_SAVEPOINT = "endpoint_runtime_message"
RELEASE = f"RELEASE SAVEPOINT {MESSAGE_SAVEPOINT}"
RELEASE_AND_TAKE = f"{RELEASE}; SAVEPOINT {MESSAGE_SAVEPOINT}"
ROLL_BACK_AND_RELEASE = f"ROLLBACK TO SAVEPOINT {MESSAGE_SAVEPOINT}; {RELEASE}"

Received = TransportMessage | PoisonMessage


class SavepointBatch:
    """The messages of one received batch, each behind its savepoint (see the module
    docstring); ``committed`` gets the units whose work stays in the batch."""

    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool, connection: DatabaseConnection,
                 committed: list[Unit]) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._connection = connection
        self.committed = committed
        self.outgoing = BufferedDispatcher(pool, pipeline.delayed_store)
        self._handler_connection = LazySavepointConnection(
            OpenTransactionConnection(connection), self._ensure_savepoint)
        self._executor = cast("DatabaseConnection",
                              LazySavepointConnection(connection, self._release_open))
        self._taken = False
        """The running message took its savepoint."""
        self._open: tuple[TransportMessage, Unit, BufferedDispatcher] | None = None
        """A handled message whose savepoint is not released yet."""
        self.retry: list[TransportMessage] = []
        self.handled = self.failed = 0

    async def process(self, batch: list[Received]) -> Round:
        """Every message of ``batch``, the failed ones' rows put back, the outgoing messages
        written (the caller commits)."""
        try:
            for received in batch:
                await self._process_one(received)
            await self._release_open()
        finally:
            if self._open is not None:  # raised: the caller rolls back
                self._open[1].rolled_back()
        if self.retry:
            await receiving.reinsert(self._connection, self._pipeline.local_address, self.retry)
        await self.outgoing.flush(self._connection)
        return Round(taken=len(batch), handled=self.handled, failed=self.failed)

    async def _process_one(self, received: Received) -> None:
        self._taken = False
        own = BufferedDispatcher(self._pool, self._pipeline.delayed_store)
        unit = Unit(self._executor, own, self._handler_connection)
        context = IncomingContext(received, unit)
        await self._pipeline.enter(context)
        outcome = context.outcome
        if outcome is Outcome.FAILED:
            assert isinstance(received, TransportMessage)
            if self._taken:
                await self._connection.execute(ROLL_BACK_AND_RELEASE)
            self._failed(received, unit)
        elif outcome is Outcome.HANDLED and self._taken:
            assert isinstance(received, TransportMessage)
            self._open = (received, unit, own)  # released with the next savepoint
        else:
            self._keep(unit, outcome, own)

    def _ensure_savepoint(self) -> Awaitable[None] | None:
        """Before each query of the running message: its savepoint's statement to await
        first, once."""
        if self._taken:
            return None
        self._taken = True
        return self._release_open(take_next=True)

    async def _release_open(self, *, take_next: bool = False) -> None:
        """Release the open message's savepoint (and take the next message's), or charge the
        message if its transaction is aborted."""
        if self._open is None:
            if take_next:
                await self._connection.execute(f"SAVEPOINT {MESSAGE_SAVEPOINT}")
            return
        received, unit, own = self._open
        self._open = None
        try:
            await self._connection.execute(RELEASE_AND_TAKE if take_next else RELEASE)
        except asyncpg.PostgresError as exc:
            # The savepoint is still there: back to it; it then serves the next message.
            await self._connection.execute(
                f"ROLLBACK TO SAVEPOINT {MESSAGE_SAVEPOINT}" if take_next
                else ROLL_BACK_AND_RELEASE)
            unit.rolled_back(exc)  # charged to the message
            self._failed(received, unit)
            return
        self._keep(unit, Outcome.HANDLED, own)

    def _keep(self, unit: Unit, outcome: Outcome, own: BufferedDispatcher) -> None:
        self.committed.append(unit)
        if outcome is Outcome.HANDLED:
            self.handled += 1
            self.outgoing.take_from(own)
        else:
            self.failed += 1  # moved on by recoverability

    def _failed(self, received: TransportMessage, unit: Unit) -> None:
        unit.rolled_back()
        self.retry.append(received)
        self.failed += 1
