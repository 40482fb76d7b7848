"""TransactionMode.NONE: the DELETE commits before the handler runs (at-most-once).

A failed message is not retried: a copy goes to the error queue so it is not lost from sight;
so does a message whose handler a stop cancelled (after ``stop_timeout``). Sends leave at once,
each in its own transaction; ``context.connection`` is an autocommit connection.

Committed counts (``transactions.counting``): a message is counted once its handlers returned
(processed) or its copy went to the error queue (failed), outside any transaction. The counts
wait in the slot and go with the next statement it sends anyway, the BEGIN of its next receive
(or, at the slot's end, in a statement of their own). A receiver process killed in between
loses the counts of the messages it handled since its last receive: none mode promises at most
once, and so do its counts.
"""

from __future__ import annotations

import asyncio

import asyncpg
import structlog

from endpoint_runtime.errors import HandlerCancelledError
from endpoint_runtime.messages import PoisonMessage
from endpoint_runtime.pipeline import Outcome, Pipeline
from endpoint_runtime.transactions.base import EMPTY, ImmediateDispatcher, ReceiveSlot, Round
from endpoint_runtime.transactions.counting import NO_COUNTS, PendingCounts
from endpoint_runtime.transactions.single import (
    FAILED_ROUND,
    HANDLED_ROUND,
    joined,
    rollback_quietly,
)
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import QUERY_ERRORS, DatabaseConnection

log = structlog.get_logger("endpoint_runtime.none")


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
        self.pending = PendingCounts()

    async def round(self) -> Round:
        pipeline, connection = self._strategy.pipeline, self.connection
        dispatcher = self._strategy.dispatcher
        carried = self.pending.snapshot()
        count = await self._count(connection, carried)
        try:
            await connection.execute(joined("BEGIN", count))
            received = await receiving.receive(connection, pipeline.local_address)
            if isinstance(received, PoisonMessage):
                # Moved in the receive transaction: if the move fails the row stays.
                await pipeline.process(received, connection, dispatcher, connection)
                count = await self.counts.statement(connection, failed=1)
                await connection.execute(joined(count, "COMMIT"))
            else:
                await connection.execute("COMMIT")
        except BaseException:
            await rollback_quietly(connection)
            raise
        self.pending.sent(carried)
        if received is None:
            return EMPTY
        if isinstance(received, PoisonMessage):
            return FAILED_ROUND
        try:
            outcome = await pipeline.process(received, connection, dispatcher, connection)
        except asyncio.CancelledError:
            # A stop cut the handler short; the row is gone: keep a copy, then stop. On the
            # pool: the cancelled handler may have left its own connection mid-query.
            pipeline.failed(received, HandlerCancelledError())
            moved = await asyncio.shield(pipeline.give_up(self._strategy.pool, received))
            self.pending.add(failed=int(moved is Outcome.MOVED_TO_ERROR))
            raise
        if outcome is Outcome.FAILED:
            # The message is gone from the queue: nothing can retry it.
            outcome = await pipeline.give_up(connection, received)
        self.pending.add(processed=int(outcome is Outcome.HANDLED),
                         failed=int(outcome is Outcome.MOVED_TO_ERROR))
        if outcome is Outcome.HANDLED:
            pipeline.succeeded(received)
            return HANDLED_ROUND
        return FAILED_ROUND

    async def _count(self, connection: DatabaseConnection, counts: tuple[int, int]) -> str:
        processed, failed = counts
        return await self.counts.statement(connection, processed=processed, failed=failed)

    async def release(self) -> None:
        """The counts still waiting, in a statement of their own, on another connection (a
        stop may have cut a handler short mid-query on this one)."""
        carried = self.pending.snapshot()
        if carried == (0, 0) or self.counts is NO_COUNTS:
            return
        try:
            async with self._strategy.pool.acquire() as connection:
                await connection.execute(await self._count(connection, carried))
        except QUERY_ERRORS as exc:
            log.warning("committed_counts_lost", processed=carried[0], failed=carried[1],
                        error=f"{type(exc).__name__}: {exc}")
            return
        self.pending.sent(carried)
