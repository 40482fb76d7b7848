"""TransactionMode.NONE: the DELETE commits before the handler runs (at-most-once).

A failed message is not retried: a copy goes to the error queue so it is not lost from sight;
so does a message whose handler a stop cancelled (after ``stop_timeout``). Sends leave at once,
each in its own transaction; ``context.connection`` is an autocommit connection.
"""

from __future__ import annotations

import asyncio

import asyncpg

from endpoint_runtime.errors import HandlerCancelledError
from endpoint_runtime.messages import PoisonMessage
from endpoint_runtime.pipeline import Outcome, Pipeline
from endpoint_runtime.transactions.base import EMPTY, ImmediateDispatcher, ReceiveSlot, Round
from endpoint_runtime.transactions.single import FAILED_ROUND, HANDLED_ROUND
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
        pipeline, connection = self._strategy.pipeline, self.connection
        dispatcher = self._strategy.dispatcher
        async with connection.transaction():
            received = await receiving.receive(connection, pipeline.local_address)
            if isinstance(received, PoisonMessage):
                # Moved in the receive transaction: if the move fails the row stays.
                await pipeline.process(received, connection, dispatcher, connection)
                return FAILED_ROUND
        if received is None:
            return EMPTY
        try:
            outcome = await pipeline.process(received, connection, dispatcher, connection)
        except asyncio.CancelledError:
            # A stop cut the handler short; the row is gone: keep a copy, then stop. On the
            # pool: the cancelled handler may have left its own connection mid-query.
            pipeline.failed(received, HandlerCancelledError())
            await asyncio.shield(pipeline.give_up(self._strategy.pool, received))
            raise
        if outcome is Outcome.FAILED:
            # The message is gone from the queue: nothing can retry it.
            await pipeline.give_up(connection, received)
            return FAILED_ROUND
        if outcome is Outcome.HANDLED:
            pipeline.succeeded(received)
            return HANDLED_ROUND
        return FAILED_ROUND
