"""Batched atomic receive (beyond the original): up to N messages per transaction.

BEGIN; DELETE up to N lowest unlocked seqs; for each message run the handlers with a savepoint
taken on its first database use; a failed message's work is rolled back to its savepoint, its
outgoing messages dropped, and its row re-inserted with the original seq so it is retried on
its own; write all outgoing messages (one round trip per destination); COMMIT once, with the
slot's committed count of the batch (``transactions.counting``: the messages whose handlers ran
as processed, those moved to the error queue as failed) in the same simple query.

If the batch itself cannot commit (e.g. an outgoing message to a queue that does not exist),
everything rolls back and the next N messages are received one by one, so that the failure is
charged to the message that caused it.
"""

from __future__ import annotations

import asyncpg
import structlog

from endpoint_runtime.messages import PoisonMessage, TransportMessage
from endpoint_runtime.pipeline import Outcome, Pipeline, Unit
from endpoint_runtime.transactions.base import EMPTY, BufferedDispatcher, ReceiveSlot, Round
from endpoint_runtime.transactions.counting import SlotCounts
from endpoint_runtime.transactions.optimistic_batch import OptimisticBatch
from endpoint_runtime.transactions.receive_transaction import (
    begin_unless_carried,
    end_carried_transaction,
    joined,
    rollback_quietly,
)
from endpoint_runtime.transactions.single import SingleMessageStrategy
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.connection import DatabaseConnection, is_lost
from endpoint_runtime.transport.savepoints import (
    LazySavepointConnection,
    OpenTransactionConnection,
)

log = structlog.get_logger("endpoint_runtime.batched")

MESSAGE_SAVEPOINT = "endpoint_runtime_message"


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

    async def receive_batch(self, connection: DatabaseConnection, counts: SlotCounts) -> Round:
        """One batch in one transaction, committed with its count in ``counts``' row; a
        failure to commit it is raised, rolled back."""
        if self.isolation == "optimistic":
            return await self._optimistic_batch(connection, counts)
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
            batch = await receiving.receive_batch(connection, self._pipeline.local_address,
                                                  self.batch_size)
            if not batch:
                await connection.execute("COMMIT")  # expired rows deleted on the way
                return EMPTY
            return await OptimisticBatch(self._pipeline, self._pool, connection,
                                         counts).process(batch)
        except BaseException:
            await rollback_quietly(connection)
            raise

    async def _process_batch(self, connection: DatabaseConnection, committed: list[Unit]) -> Round:
        """Each message of the batch through the chain; ``committed`` gets the units of those
        whose work stays in the batch (handled or moved by recoverability)."""
        pipeline = self._pipeline
        batch = await receiving.receive_batch(connection, pipeline.local_address, self.batch_size)
        if not batch:
            return EMPTY
        outgoing = BufferedDispatcher(self._pool, pipeline.delayed_store)
        retry: list[TransportMessage] = []
        handled = failed = 0
        for received in batch:
            unit, outcome = await self._process_one(connection, received, outgoing)
            if outcome is not Outcome.FAILED:
                committed.append(unit)
            if outcome is Outcome.HANDLED:
                handled += 1
            elif outcome is Outcome.FAILED:
                assert isinstance(received, TransportMessage)
                retry.append(received)
                failed += 1
            else:
                failed += 1  # moved on by recoverability
        if retry:
            await receiving.reinsert(connection, pipeline.local_address, retry)
        await outgoing.flush(connection)
        return Round(taken=len(batch), handled=handled, failed=failed)

    async def _process_one(
        self, connection: DatabaseConnection, received: TransportMessage | PoisonMessage,
        outgoing: BufferedDispatcher,
    ) -> tuple[Unit, Outcome]:
        """One message of the batch, its database work in a savepoint taken on first use: a
        failed message's work rolls back to it, its outgoing messages are dropped."""
        savepoint = False

        async def ensure_savepoint() -> None:
            nonlocal savepoint
            if not savepoint:
                await connection.execute(f"SAVEPOINT {MESSAGE_SAVEPOINT}")
                savepoint = True

        own = BufferedDispatcher(self._pool, self._pipeline.delayed_store)
        # The batch's transaction began with a plain BEGIN: handlers' transactions are
        # savepoints (OpenTransactionConnection), after the message's own.
        unit = Unit(connection, own, LazySavepointConnection(
            OpenTransactionConnection(connection), ensure_savepoint))
        outcome = await self._pipeline.run(received, unit)
        if outcome is Outcome.HANDLED and savepoint:
            try:
                # Fails if the handler caught a database error without a savepoint of its own.
                await connection.execute(f"RELEASE SAVEPOINT {MESSAGE_SAVEPOINT}")
            except asyncpg.PostgresError as exc:
                unit.rolled_back(exc)  # charged to the message
                outcome = Outcome.FAILED
        if outcome is Outcome.FAILED:
            if savepoint:
                await connection.execute(f"ROLLBACK TO SAVEPOINT {MESSAGE_SAVEPOINT}; "
                                         f"RELEASE SAVEPOINT {MESSAGE_SAVEPOINT}")
            unit.rolled_back()
        elif outcome is Outcome.HANDLED:
            outgoing.take_from(own)
        return unit, outcome


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
            log.warning("batch_rolled_back", error=f"{type(exc).__name__}: {exc}"[:500])
        # The receiver ends a slot whose round raises, and the one-by-one rounds with it: a
        # batch that cannot commit would come back as a batch for ever. The first one-by-one
        # round runs now instead (it raises what is not a message's failure).
        self.single_rounds_left -= 1
        return await self._one_by_one.round()
