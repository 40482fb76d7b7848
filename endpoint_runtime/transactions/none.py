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

from endpoint_runtime.chain.pipeline import Outcome, Pipeline, Unit
from endpoint_runtime.transactions.base import EMPTY, ImmediateDispatcher, ReceiveSlot, Round
from endpoint_runtime.transactions.counting import NO_COUNTS, PendingCounts
from endpoint_runtime.transactions.receive_transaction import (
    FAILED_ROUND,
    joined,
    rollback_quietly,
    settled,
)
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import QUERY_ERRORS, DatabaseConnection
from endpoint_runtime.wire.messages import PoisonMessage

log = structlog.get_logger("endpoint_runtime.none")


class NoTransactionStrategy:
    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool) -> None:
        self.pipeline = pipeline
        self.pool = pool
        self.dispatcher = ImmediateDispatcher(pool, pipeline.delayed_store)

    def open_slot(self, connection: DatabaseConnection) -> NoTransactionSlot:
        return NoTransactionSlot(self, connection)


class NoTransactionSlot(ReceiveSlot):
    """A slot that carries nothing between rounds but its counts: each DELETE commits at
    once."""

    def __init__(self, strategy: NoTransactionStrategy, connection: DatabaseConnection) -> None:
        super().__init__(connection)
        self._strategy = strategy
        self.pending = PendingCounts()

    async def round(self) -> Round:
        """The DELETE commits (with the counts waiting), then one call into the chain, whose
        recoverability step sends a failed message to the error queue itself
        (``Unit.retries`` false): nothing can retry it. A stop that cancels the handlers
        leaves a copy there too (on the pool: the handlers' connection may be mid-query). A
        poison row is moved in the receive transaction: if the move fails the row stays."""
        connection = self.connection
        carried = self.pending.snapshot()
        count = await self._count(connection, carried)
        try:
            await connection.execute(joined("BEGIN", count))
            received = await receiving.receive(connection, self._strategy.pipeline.local_address)
            if isinstance(received, PoisonMessage):
                unit, _ = await self._run(received)
                count = await self.counts.statement(connection,
                                                    failed=int(unit.moved_to_error))
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
            unit.committed()
            return FAILED_ROUND
        unit, outcome = await self._run(received)
        self.pending.add(processed=int(unit.handled), failed=int(unit.moved_to_error))
        if outcome is Outcome.FAILED:
            unit.rolled_back()
            return FAILED_ROUND
        return settled(unit, outcome)

    async def _run(self, received: receiving.Received) -> tuple[Unit, Outcome]:
        """The one call into the chain."""
        strategy, connection = self._strategy, self.connection
        unit = Unit(connection, strategy.dispatcher, connection, retries=False,
                    spare=strategy.pool)
        try:
            return unit, await strategy.pipeline.run(received, unit)
        except asyncio.CancelledError:
            self.pending.add(failed=int(unit.moved_to_error))  # its copy, kept on the pool
            raise

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
