"""Receive-only transport transactions with the outbox: exactly-once effect on business data.

Per message, on the receive connection (A) and a business connection (B) the slot keeps:

1. A: BEGIN; DELETE the lowest unlocked seq (receive); in optimistic mode the same statement
   looks the message id up in the outbox.
2. One call into the chain with an :class:`~endpoint_runtime.chain.outbox.step.OutboxUnit` (A, B,
   what the look-up found): recoverability's moves go on A; the outbox step runs the
   deduplication, the business transaction on B with the handlers, and the dispatch
   (``endpoint_runtime.chain.outbox.step``).
3. A: COMMIT (the ack), usually together with the acks of the next messages when the dispatch
   went with the business commit (``transactions.ack_group``, setting ``acks_per_commit``).

The slot's committed count (``transactions.counting``) of a handled message commits with its
record in 2, so a redelivered message, found recorded, is not counted again; a message moved to
the error queue is counted as failed with the receive transaction's COMMIT.

The mark and the inserts commit together, so each record is dispatched exactly once; if the
process dies between the business commit and the dispatch, the redelivered message finds its
record and is only dispatched; if it dies before the ack, the redelivered message finds its
record dispatched and is only acked.
"""

from __future__ import annotations

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from endpoint_runtime.chain.outbox.step import OutboxUnit
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.pipeline import Outcome, Pipeline
from endpoint_runtime.settings import OutboxSettings
from endpoint_runtime.transactions.ack_group import AckGroup
from endpoint_runtime.transactions.base import EMPTY, BufferedDispatcher, ReceiveSlot, Round
from endpoint_runtime.transactions.receive_transaction import (
    FAILED_ROUND,
    begin_unless_carried,
    charge_or_raise,
    commit_and_begin,
    end_carried_transaction,
    rollback_quietly,
    rolled_back,
    settled,
)
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import (
    QUERY_ERRORS,
    DatabaseConnection,
    in_transaction,
    is_lost,
    keeps_session,
)
from endpoint_runtime.transport.receiving import Received
from endpoint_runtime.transport.savepoints import OpenTransactionConnection
from endpoint_runtime.wire.messages import TransportMessage

log = structlog.get_logger("endpoint_runtime.chain.outbox.storage")


class OutboxStrategy:
    def __init__(
        self, pipeline: Pipeline, pool: asyncpg.Pool, storage: OutboxStorage,
        settings: OutboxSettings,
    ) -> None:
        self.pipeline = pipeline
        self.pool = pool
        self._storage = storage
        self.settings = settings

    @property
    def handler_runs(self) -> int:
        """Business transactions begun (the outbox step's count)."""
        return int(self.pipeline.step("outbox").handler_runs)

    @property
    def duplicates(self) -> int:
        return self.pipeline.stats.outbox_duplicates

    def open_slot(self, connection: DatabaseConnection) -> OutboxSlot:
        return OutboxSlot(self, connection)

    async def run_round(self, slot: OutboxSlot) -> Round:
        """(BEGIN unless carried over;) receive one message; one call into the chain; then the
        ack: committed now, or left waiting in the slot's group (``transactions.ack_group``)."""
        connection, group = slot.connection, slot.group
        group.begin_round()
        pipeline = self.pipeline
        await begin_unless_carried(connection)
        received = unit = None
        try:
            received, recorded = await self._receive(connection, pipeline.local_address)
            if received is None:
                group.committed()
                await connection.execute("COMMIT")  # expired rows deleted on the way
                return EMPTY
            business = await slot.business_connection()
            unit = OutboxUnit(connection, BufferedDispatcher(self.pool, pipeline.delayed_store),
                              OpenTransactionConnection(business), business, recorded,
                              slot.counts)
            outcome = await pipeline.run(received, unit)
            if outcome is Outcome.HANDLED and unit.dispatched and group.can_defer():
                group.defer()  # the work and its dispatch committed; the ack waits
                return settled(unit, outcome)
            group.committed()
            if outcome is Outcome.FAILED:
                return await rolled_back(connection, unit)
            # A handled message was counted with its record (business transaction).
            count = await slot.counts.statement(connection, failed=int(unit.moved_to_error))
            await commit_and_begin(connection, count, handled=outcome is Outcome.HANDLED)
        except BaseException as exc:
            group.committed()
            await rollback_quietly(connection)
            charge_or_raise(unit, received, exc, connection)
            return FAILED_ROUND
        return settled(unit, outcome)

    async def _receive(
        self, connection: DatabaseConnection, address: QueueAddress
    ) -> tuple[Received | None, bool | None]:
        """The message and, when the receive could look its id up (optimistic mode, headers
        that carry it in this runtime's own form: a round trip saved), whether the outbox has
        it recorded; else ``None`` for that."""
        pessimistic = self.settings.pessimistic
        statement = (receiving.receive_statement(address) if pessimistic
                     else self._storage.receive_and_look_up(address))
        row = await receiving.receive_row(connection, address, statement)
        if row is None:
            return None, None
        message = receiving.to_message(row)
        if (not pessimistic and isinstance(message, TransportMessage)
                and row["looked_up_id"] == message.message_id):
            return message, bool(row["recorded"])
        return message, None


class OutboxSlot(ReceiveSlot):
    """A receive slot of the outbox: its business connection, kept for the slot's life
    (returning a connection to the pool costs a reset round trip per message), and the acks
    waiting in its open receive transaction."""

    def __init__(self, strategy: OutboxStrategy, connection: DatabaseConnection) -> None:
        super().__init__(connection)
        self._strategy = strategy
        self.group = AckGroup(strategy.settings.acks_per_commit)
        self.business: PoolConnectionProxy[asyncpg.Record] | None = None

    async def round(self) -> Round:
        if self.business is None:
            await self._prepare()
        return await self._strategy.run_round(self)

    async def _prepare(self) -> None:
        """Before the slot's first transaction: the receive transaction (the acks, and the
        dispatches made there) may commit without waiting for its WAL flush. If a crash loses
        it, it is lost whole: its messages come back, find their records, are dispatched if
        they were not, and acked. The business transaction, on the other connection, stays
        synchronous. RESET when the slot returns the connection to the pool. Behind a
        transaction-mode pooler the session is not the slot's own (the setting would reach
        other clients' transactions): acks stay synchronous there."""
        if not in_transaction(self.connection):
            if not self._strategy.settings.synchronous_acks and keeps_session(self.connection):
                await self.connection.execute("SET synchronous_commit = off")
            await self.business_connection()

    async def business_connection(self) -> PoolConnectionProxy[asyncpg.Record]:
        pool = self._strategy.pool
        if self.business is not None and is_lost(self.business):
            await pool.release(self.business)
            self.business = None
        if self.business is None:
            self.business = await pool.acquire()
        return self.business

    async def release(self) -> None:
        try:
            if self.group.open:
                await _commit_acks(self.connection, self.group)
            await end_carried_transaction(self.connection)
        finally:
            # Whatever became of the receive connection, the business one goes back.
            if self.business is not None:
                business, self.business = self.business, None
                try:
                    await end_carried_transaction(business)
                finally:
                    await self._strategy.pool.release(business)


async def _commit_acks(connection: DatabaseConnection, group: AckGroup) -> None:
    """The slot ends with acks waiting: commit them. If that fails they roll back; their
    messages come again and are acknowledged then."""
    if not in_transaction(connection):
        return
    try:
        await connection.execute("COMMIT")
    except QUERY_ERRORS as exc:
        log.warning("outbox_acks_rolled_back", acks=group.acks,
                    error=f"{type(exc).__name__}: {exc}")
