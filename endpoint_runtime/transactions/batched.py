"""Batched atomic receive (beyond the original): up to N messages per transaction.

BEGIN; DELETE up to N lowest unlocked seqs; each message through the chain in that
transaction, kept apart from the others' failures as ``batch_isolation`` says: optimistically
(``transactions.optimistic_batch``: no savepoint per message, a failure rolls the batch back and
runs it again without the message whose own run fails) or with a savepoint per message
(``transactions.savepoint_batch``); a failed message's row is re-inserted with its original
seq, so it is retried; the outgoing messages and the slot's committed count of the batch
(``transactions.counting``: the messages whose handlers ran as processed, those moved to the
error queue as failed) go with the one COMMIT.

If the batch itself cannot commit (e.g. the connection failed at COMMIT), everything rolls
back and the next N messages are received one by one, so that a failure is charged to the
message that caused it.
"""

from __future__ import annotations

from collections.abc import Awaitable

import asyncpg
import structlog

from endpoint_runtime.chain.pipeline import Pipeline, Unit
from endpoint_runtime.transactions.base import EMPTY, ReceiveSlot, Round
from endpoint_runtime.transactions.counting import SlotCounts
from endpoint_runtime.transactions.optimistic_batch import OptimisticBatch
from endpoint_runtime.transactions.receive_transaction import (
    begin_unless_carried,
    end_carried_transaction,
    joined,
    raise_if_counts_refused,
    rollback_quietly,
)
from endpoint_runtime.transactions.savepoint_batch import SavepointBatch
from endpoint_runtime.transactions.single import SingleMessageStrategy
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import DatabaseConnection, is_lost

log = structlog.get_logger("endpoint_runtime.batched")


class BatchedAtomicStrategy:
    """``isolation``: ``"optimistic"`` (``transactions.optimistic_batch``) or ``"savepoint"``
    (a savepoint per message that uses the database, below)."""

    def __init__(self, pipeline: Pipeline, pool: asyncpg.Pool, batch_size: int,
                 isolation: str = "optimistic") -> None:
        self._pipeline = pipeline
        self._pool = pool
        self.batch_size = batch_size
        self.isolation = isolation
        self.one_by_one = SingleMessageStrategy(pipeline, pool, sends_atomic=True)

    def open_slot(self, connection: DatabaseConnection) -> BatchedSlot:
        return BatchedSlot(self, connection)

    def receive_batch(self, connection: DatabaseConnection, counts: SlotCounts
                      ) -> Awaitable[Round]:
        """One batch in one transaction, committed with its count in ``counts``' row; a
        failure to commit it is raised, rolled back. (The isolation's coroutine itself, not
        one around it: a frame less between the slot and every handler's round trip.)"""
        if self.isolation == "optimistic":
            return self._optimistic_batch(connection, counts)
        return self._savepoint_batch(connection, counts)

    async def _savepoint_batch(self, connection: DatabaseConnection,
                               counts: SlotCounts) -> Round:
        # One by one, each COMMIT began the next transaction: end it before the batch's own.
        # A plain BEGIN (not asyncpg's transaction) so that the count goes with the COMMIT.
        await end_carried_transaction(connection)
        await connection.execute("BEGIN")
        committed: list[Unit] = []
        try:
            result = await self._process_batch(connection, committed)
            count = await counts.statement(
                connection, processed=sum(unit.handled for unit in committed),
                failed=sum(unit.moved_to_error for unit in committed))
            await connection.execute(joined(count, "COMMIT"))
        except BaseException:
            # Connection lost or COMMIT failed (the server rolled back): nothing to undo. The
            # batch's messages come again, uncharged (one by one, see BatchedSlot).
            await rollback_quietly(connection)
            for unit in committed:
                unit.rolled_back()
            raise
        for unit in committed:
            unit.committed()
        return result

    async def _optimistic_batch(self, connection: DatabaseConnection,
                                counts: SlotCounts) -> Round:
        await begin_unless_carried(connection)  # the last batch's COMMIT began it
        try:
            with self._pipeline.batch() as received:  # replays stay inside: linked to it
                batch = await receiving.receive_batch(
                    connection, self._pipeline.local_address, self.batch_size)
                received.taken(len(batch))
                if not batch:
                    await connection.execute("COMMIT")  # expired rows deleted on the way
                    return EMPTY
                return await OptimisticBatch(self._pipeline, self._pool, connection,
                                             counts).process(batch)
        except BaseException:
            await rollback_quietly(connection)
            raise

    async def _process_batch(self, connection: DatabaseConnection, committed: list[Unit]) -> Round:
        """Each message of the batch through the chain behind its savepoint
        (``transactions.savepoint_batch``); ``committed`` gets the units of those whose work
        stays in the batch (handled or moved by recoverability)."""
        with self._pipeline.batch() as received:
            batch = await receiving.receive_batch(connection, self._pipeline.local_address,
                                                  self.batch_size)
            received.taken(len(batch))
            if not batch:
                return EMPTY
            return await SavepointBatch(self._pipeline, self._pool, connection,
                                        committed).process(batch)


class BatchedSlot(ReceiveSlot):
    """A slot of batches; after a batch that could not commit, its next ``batch_size`` rounds
    go one message at a time, so that the failure is charged to the message that caused it."""

    def __init__(self, strategy: BatchedAtomicStrategy, connection: DatabaseConnection) -> None:
        super().__init__(connection)
        self._strategy = strategy
        self._one_by_one = strategy.one_by_one.open_slot(connection)
        self.single_rounds_left = 0

    def count_with(self, counts: SlotCounts) -> None:
        super().count_with(counts)
        self._one_by_one.count_with(counts)

    async def release(self) -> None:
        await end_carried_transaction(self.connection)

    async def round(self) -> Round:
        if self.single_rounds_left > 0:
            self.single_rounds_left -= 1
            return await self._one_by_one.round()
        try:
            return await self._strategy.receive_batch(self.connection, self.counts)
        except BaseException as exc:
            self.single_rounds_left = self._strategy.batch_size
            if not isinstance(exc, Exception) or is_lost(self.connection):
                raise
            raise_if_counts_refused(exc)  # a set-up fault: one by one would fail the same
            log.warning("batch_rolled_back", error=f"{type(exc).__name__}: {exc}"[:500])
        # The receiver ends a slot whose round raises, and the one-by-one rounds with it: a
        # batch that cannot commit would come back as a batch for ever. The first one-by-one
        # round runs now instead (it raises what is not a message's failure).
        self.single_rounds_left -= 1
        return await self._one_by_one.round()
