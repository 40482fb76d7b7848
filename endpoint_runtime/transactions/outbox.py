"""Receive-only transport transactions with the outbox: exactly-once effect on business data.

Per message, on the receive connection (A) and a business connection (B):

1. A: BEGIN; DELETE the lowest unlocked seq (receive); look up the message id in the outbox.
2. Absent: B: BEGIN (isolation setting); [pessimistic: insert a placeholder record, so a
   concurrent duplicate blocks]; run the handlers with ``context.connection`` = B, collecting
   every outgoing operation; store the record with its operations; COMMIT B. An optimistic
   duplicate that loses on the primary key rolls back its business work here.
3. Dispatch, outside the business transaction: in the same round trip as B's COMMIT, a second
   transaction on B inserts the operations into their one queue and marks the record dispatched.
   Operations for several queues, delayed ones, large ones, a recorded message id (a
   duplicate), or a dispatch that failed after the business commit: on A instead, where the
   record is locked (FOR UPDATE) and, unless already dispatched, its operations inserted and
   the record marked.
4. A: COMMIT (the ack), usually together with the acks of the next messages
   (``transactions.ack_group``, setting ``acks_per_commit``).

The slot's committed count (``transactions.counting``) of a handled message commits with its
record in 2, so a redelivered message, found recorded, is not counted again; a message moved to
the error queue is counted as failed with the receive transaction's COMMIT.

The mark and the inserts commit together, so each record is dispatched exactly once; if the
process dies between 2 and 3, the redelivered message finds its record and only step 3 runs; if
it dies between 3 and 4, the redelivered message finds its record dispatched and is only acked.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable

import asyncpg
import structlog
from asyncpg.pool import PoolConnectionProxy

from endpoint_runtime.context import parse_address
from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.messages import (
    OutgoingMessage,
    TransportMessage,
    encode_headers,
)
from endpoint_runtime.outbox import (
    OutboxStorage,
    TransportOperation,
    decode_operations,
    delayed_operation_of,
    encode_operations,
    operation_of,
)
from endpoint_runtime.pipeline import Outcome, Pipeline
from endpoint_runtime.settings import OutboxSettings
from endpoint_runtime.transactions.ack_group import AckGroup
from endpoint_runtime.transactions.base import (
    EMPTY,
    BufferedDispatcher,
    ReceiveSlot,
    Round,
    as_delayed,
)
from endpoint_runtime.transactions.connections import OpenTransactionConnection
from endpoint_runtime.transactions.counting import NO_COUNTS, SlotCounts
from endpoint_runtime.transactions.single import (
    FAILED_ROUND,
    begin_unless_carried,
    charge_or_raise,
    commit_and_begin,
    end_carried_transaction,
    joined,
    rollback_quietly,
    settled,
)
from endpoint_runtime.transport import receiving, sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import (
    QUERY_ERRORS,
    DatabaseConnection,
    in_transaction,
    is_lost,
    prepared_name,
)
from endpoint_runtime.transport.literals import bytea_literal, float_literal, text_literal
from endpoint_runtime.transport.receiving import Received
from endpoint_runtime.transport.sending import STATEMENT_SIZE_LIMIT, row_id

log = structlog.get_logger("endpoint_runtime.outbox")
DISPATCH_PARAMETER_TYPES = "text, uuid[], float8[], text[], bytea[]"
DISPATCH_LOCK_TIMEOUT = "5s"  # a dispatch on B waits no longer for a lock (see ack_group)


def _array(literals: Iterable[str]) -> str:
    return f"ARRAY[{', '.join(literals)}]"


class OutboxStrategy:
    def __init__(
        self, pipeline: Pipeline, pool: asyncpg.Pool, storage: OutboxStorage,
        settings: OutboxSettings,
    ) -> None:
        self._pipeline = pipeline
        self.pool = pool
        self._storage = storage
        self.settings = settings
        self.handler_runs = 0
        self.duplicates = 0

    def open_slot(self, connection: DatabaseConnection) -> OutboxSlot:
        return OutboxSlot(self, connection)

    async def run_round(self, slot: OutboxSlot) -> Round:
        """(BEGIN unless carried over;) receive one message; recoverability's move, or the
        business transaction with its dispatch; then the ack: committed now, or left waiting
        in the slot's group (``transactions.ack_group``)."""
        connection, group = slot.connection, slot.group
        group.begin_round()
        pipeline = self._pipeline
        await begin_unless_carried(connection)
        received = None
        try:
            received, recorded = await self._receive(connection, pipeline.local_address)
            if received is None:
                group.committed()
                await connection.execute("COMMIT")  # expired rows deleted on the way
                return EMPTY
            pipeline.bind_log_context(received)
            outcome = await pipeline.screen(received, connection)
            if outcome is None:
                assert isinstance(received, TransportMessage)
                outcome = await self._attempt(slot, received, recorded)
                if outcome is None:  # handled; its ack waits in the group
                    return settled(pipeline, received, Outcome.HANDLED)
            group.committed()
            if outcome is Outcome.FAILED:
                await rollback_quietly(connection)
                return FAILED_ROUND
            # A handled message was counted with its record (business transaction).
            count = await slot.counts.statement(
                connection, failed=int(outcome is Outcome.MOVED_TO_ERROR))
            await commit_and_begin(connection, count, handled=outcome is Outcome.HANDLED)
        except BaseException as exc:
            group.committed()
            await rollback_quietly(connection)
            charge_or_raise(pipeline, received, exc, connection)
            return FAILED_ROUND
        return settled(pipeline, received, outcome)

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

    async def _attempt(
        self, slot: OutboxSlot, message: TransportMessage, recorded: bool | None
    ) -> Outcome | None:
        """The business transaction (unless the id is recorded) and, with its commit, the
        dispatch; else the dispatch in the receive transaction. ``HANDLED``: commit the ack
        now; ``None``: the ack waits in the group; ``FAILED``: roll back."""
        business = await slot.business_connection()
        dispatched = await self._run_handlers(message, business, recorded, slot.counts)
        if dispatched is None:
            return Outcome.FAILED
        if dispatched and slot.group.can_defer():
            slot.group.defer()
            return None
        if not dispatched:
            await self._dispatch(slot.connection, message.message_id)
        return Outcome.HANDLED

    async def _run_handlers(
        self, message: TransportMessage, business: DatabaseConnection, recorded: bool | None,
        counts: SlotCounts = NO_COUNTS,
    ) -> bool | None:
        """The business transaction: handlers, the outbox record and the slot's count of the
        message commit together; then, in the same round trip, the dispatch when it can go
        there.

        ``recorded`` is what the receive found out about the message id (``None``: nothing).
        Returns whether the operations were dispatched: ``False`` when they are still to be
        (by the receive transaction), and when the message id was already recorded (a
        duplicate: the handlers did not run, or their work rolled back); ``None`` when the
        handlers failed (counted by the pipeline; the business work rolled back).

        Optimistic mode chains transactions as the receive does: the COMMIT goes with the
        next BEGIN, so the next message's business work starts without a round trip.
        """
        message_id = message.message_id
        pessimistic = self.settings.pessimistic
        isolation = self.settings.isolation.replace("_", " ").upper()
        begin = f"BEGIN ISOLATION LEVEL {isolation}"
        carried = in_transaction(business)
        try:
            if pessimistic:
                duplicate = not await self._storage.claim(business, message_id, begin=begin)
            elif recorded is None:
                duplicate = await self._storage.look_up(
                    business, message_id, begin=None if carried else begin)
            else:
                duplicate = recorded
                if not duplicate and not carried:
                    await business.execute(begin)
            if duplicate:  # recorded by an earlier delivery
                await _rollback(business)
                self._count_duplicate("pessimistic" if pessimistic else "optimistic")
                return False
            collected = BufferedDispatcher(self.pool, self._pipeline.delayed_store)
            context = self._pipeline.new_context(
                message, collected, OpenTransactionConnection(business))
            self.handler_runs += 1
            if await self._pipeline.handle(message, context) is Outcome.FAILED:
                await _rollback(business)
                return None
            operations = [operation_of(a, m) for a, m in collected.pending]
            operations += [delayed_operation_of(d) for d in collected.pending_delayed]
            # No operation: the record is stored dispatched, there is nothing to dispatch.
            dispatch = (await self._dispatch_statement(business, message_id, operations)
                        if operations else None)
            count = await counts.statement(business, processed=1)
            then = joined(count, "COMMIT", dispatch or "")
            try:
                await self._storage.record_and_commit(
                    business, message_id, encode_operations(operations), pessimistic=pessimistic,
                    dispatched=not operations, then=then if pessimistic else f"{then}; {begin}",
                )
            except asyncpg.UniqueViolationError as exc:
                if exc.table_name != self._storage.table.table:
                    raise
                # An optimistic duplicate lost the race: its business work rolls back.
                await _rollback(business)
                self._count_duplicate("optimistic")
                return False
            return not operations or dispatch is not None
        except BaseException as exc:
            await _rollback(business)
            if isinstance(exc, Exception) and await self._committed(business, message_id):
                # The business transaction committed, its dispatch failed: A dispatches.
                log.warning("outbox_dispatch_after_commit_failed",
                            error=f"{type(exc).__name__}: {exc}")
                return False
            raise

    def _count_duplicate(self, concurrency: str) -> None:
        self.duplicates += 1
        log.info("outbox_duplicate", concurrency=concurrency)

    async def _committed(self, business: DatabaseConnection, message_id: str) -> bool:
        """After a failure: whether the record of ``message_id`` is committed (so the
        business transaction did commit). ``False`` when that cannot be told."""
        if is_lost(business):
            return False
        with contextlib.suppress(*QUERY_ERRORS):
            return await self._storage.look_up(business, message_id, begin=None)
        return False

    @staticmethod
    def _dispatch_in_one_statement(operations: list[TransportOperation]) -> bool:
        return (bool(operations) and all(o.due is None for o in operations)
                and len({o.destination for o in operations}) == 1)

    async def _dispatch_statement(
        self, business: DatabaseConnection, message_id: str,
        operations: list[TransportOperation],
    ) -> str | None:
        """The dispatch as its own transaction, to run on B right after the business COMMIT in
        the same simple query: the operations into their one queue and the record marked, in
        one prepared statement with literal values. It commits without waiting for its WAL
        flush (lost in a crash, it is lost with every later ack: the message comes back and
        is dispatched then). ``None`` when it cannot go that way (several queues, delayed
        operations, large messages, a connection that tracks no prepared statements)."""
        if not self._dispatch_in_one_statement(operations):
            return None
        ids = [row_id(o.message_id) for o in operations]
        ttbrs = [o.time_to_be_received for o in operations]
        headers = [encode_headers(o.headers) for o in operations]
        bodies = [o.body for o in operations]
        if sum(map(len, headers)) + sum(map(len, bodies)) > STATEMENT_SIZE_LIMIT:
            return None
        destination = parse_address(operations[0].destination,
                                    self._pipeline.local_address.schema)
        try:
            name = await prepared_name(business, self._storage.dispatch_and_mark(destination),
                                       DISPATCH_PARAMETER_TYPES)
        except asyncpg.UndefinedTableError as exc:
            # The failed PREPARE aborted the business transaction: the message fails here,
            # naming the queue (else the record's INSERT would only say "aborted").
            raise QueueNotFoundError(str(destination)) from exc
        if name is None:
            return None
        asynchronous = ("" if self.settings.synchronous_acks
                        else "SET LOCAL synchronous_commit = off; ")
        return (
            f"BEGIN; {asynchronous}"
            f"SET LOCAL lock_timeout = '{DISPATCH_LOCK_TIMEOUT}'; "
            f"EXECUTE {name}({text_literal(message_id)}, "
            f"{_array(text_literal(str(i)) for i in ids)}::uuid[], "
            f"{_array('NULL' if t is None else float_literal(t) for t in ttbrs)}::float8[], "
            f"{_array(text_literal(h) for h in headers)}::text[], "
            f"{_array(bytea_literal(b) for b in bodies)}::bytea[]); COMMIT"
        )

    async def _dispatch(self, connection: DatabaseConnection, message_id: str) -> None:
        """Dispatch a stored record's operations and mark it dispatched, once."""
        row = await connection.fetchrow(self._storage.sql["take_for_dispatch"], message_id)
        if row is None:
            return  # dispatched already (by an earlier delivery or a competing duplicate)
        by_queue: dict[QueueAddress, list[OutgoingMessage]] = defaultdict(list)
        schema = self._pipeline.local_address.schema
        for operation in decode_operations(row["operations"]):
            address = parse_address(operation.destination, schema)
            outgoing = OutgoingMessage(
                message_id=operation.message_id, headers=operation.headers,
                body=operation.body, time_to_be_received=operation.time_to_be_received,
            )
            if operation.due is None:
                by_queue[address].append(outgoing)
                continue
            store = self._pipeline.delayed_store
            assert store is not None, "delayed operations need a delayed-message store"
            due = dt.datetime.fromisoformat(operation.due)
            await store.store(connection, as_delayed(address, outgoing, due))
        for address, messages in by_queue.items():
            await sending.send_many(connection, address, messages)


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
        synchronous. RESET when the slot returns the connection to the pool."""
        if not in_transaction(self.connection):
            if not self._strategy.settings.synchronous_acks:
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


async def _rollback(business: DatabaseConnection) -> None:
    if in_transaction(business):
        with contextlib.suppress(*QUERY_ERRORS):
            await business.execute("ROLLBACK")
