"""TransactionMode.NONE: the DELETE commits before the handler runs (at-most-once).

A failed message is not retried: a copy goes to the error queue so it is not lost from sight;
so does a message whose handler a stop cancelled (after ``stop_timeout``).
Sends leave at once, each in its own transaction; ``context.connection`` is an autocommit
connection.
"""

from __future__ import annotations

import asyncio

import asyncpg

from endpoint_runtime.errors import HandlerCancelledError
from endpoint_runtime.messages import PoisonMessage
from endpoint_runtime.pipeline import Pipeline
from endpoint_runtime.recoverability import Action, Decision
from endpoint_runtime.transactions.base import EMPTY, ImmediateDispatcher, Round
from endpoint_runtime.transport import receiving


class NoTransactionStrategy:
    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._dispatcher = ImmediateDispatcher(pool, pipeline.delayed_store)

    async def slot_ended(self, connection: asyncpg.Connection) -> None:
        return None

    async def receive_round(self, connection: asyncpg.Connection) -> Round:
        pipeline = self._pipeline
        async with connection.transaction():
            received = await receiving.receive(connection, pipeline.local_address)
            if isinstance(received, PoisonMessage):
                # Moved in the receive transaction: if the move fails the row stays.
                pipeline.bind_log_context(received)
                await pipeline.move_poison_to_error_queue(connection, received)
                return Round(taken=1, failed=1)
        if received is None:
            return EMPTY
        pipeline.bind_log_context(received)
        context = pipeline.new_context(received, self._dispatcher, connection)
        try:
            await pipeline.handle(received, context)
        except asyncio.CancelledError:
            # A stop cut the handler short; the row is gone: keep a copy, then stop. On the
            # pool: the cancelled handler may have left its own connection mid-query.
            pipeline.record_failure(received, HandlerCancelledError())
            await asyncio.shield(pipeline.apply_decision(
                self._pool, received, Decision(Action.ERROR_QUEUE)))
            raise
        except Exception as exc:
            pipeline.record_failure(received, exc)
            # The message is gone from the queue: nothing can retry it. Unless the handler
            # discarded it, a copy goes to the error queue (whatever limits say otherwise).
            decision = pipeline.pending_decision(received)
            if decision is None or decision.action is not Action.DISCARD:
                decision = Decision(Action.ERROR_QUEUE)
            await pipeline.apply_decision(connection, received, decision)
            return Round(taken=1, failed=1)
        return Round(taken=1, handled=1)
