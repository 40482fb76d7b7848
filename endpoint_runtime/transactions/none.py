"""TransactionMode.NONE: the DELETE commits before the handler runs (at-most-once).

A failed message is not retried: a copy goes to the error queue so it is not lost from sight;
so does a message whose handler a stop cancelled (after ``stop_timeout``). Sends leave at once,
each in its own transaction; ``context.connection`` is an autocommit connection.
"""

from __future__ import annotations

import asyncpg

from endpoint_runtime.messages import PoisonMessage
from endpoint_runtime.pipeline import Outcome, Pipeline, Unit
from endpoint_runtime.transactions.base import EMPTY, ImmediateDispatcher, ReceiveSlot, Round
from endpoint_runtime.transactions.receive_transaction import FAILED_ROUND, settled
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import DatabaseConnection


class NoTransactionStrategy:
    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool) -> None:
        self.pipeline = pipeline
        self.pool = pool
        self.dispatcher = ImmediateDispatcher(pool, pipeline.delayed_store)

    def open_slot(self, connection: DatabaseConnection) -> NoTransactionSlot:
        return NoTransactionSlot(self, connection)


class NoTransactionSlot(ReceiveSlot):
    """A slot that carries nothing between rounds: each DELETE commits at once."""

    def __init__(self, strategy: NoTransactionStrategy, connection: DatabaseConnection) -> None:
        super().__init__(connection)
        self._strategy = strategy

    async def round(self) -> Round:
        """The DELETE commits, then one call into the chain, whose recoverability step sends
        a failed message to the error queue itself (``Unit.retries`` false): nothing can
        retry it. A stop that cancels the handlers leaves a copy there too (on the pool: the
        handlers' connection may be mid-query)."""
        strategy, connection = self._strategy, self.connection
        async with connection.transaction():
            received = await receiving.receive(connection, strategy.pipeline.local_address)
            if isinstance(received, PoisonMessage):
                # Moved in the receive transaction: if the move fails the row stays.
                return await self._run(received)
        if received is None:
            return EMPTY
        return await self._run(received)

    async def _run(self, received: receiving.Received) -> Round:
        strategy, connection = self._strategy, self.connection
        unit = Unit(connection, strategy.dispatcher, connection, retries=False,
                    spare=strategy.pool)
        outcome = await strategy.pipeline.run(received, unit)
        if outcome is Outcome.FAILED:
            unit.rolled_back()
            return FAILED_ROUND
        return settled(unit, outcome)
