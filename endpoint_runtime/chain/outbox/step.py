"""The outbox's step of the chain: deduplication, the business transaction, the dispatch.

Next to its storage (:mod:`endpoint_runtime.chain.outbox.storage`), it wraps the user steps, the
audit copy and
the handlers (the steps after it) in a business transaction on the unit's second connection:

1. Look the message id up (or, pessimistic, insert a placeholder record so that a concurrent
   duplicate blocks). Recorded: a duplicate; the steps after it do not run.
2. BEGIN (isolation setting); the steps after it, with ``context.connection`` the business
   connection and every outgoing operation collected by the unit's dispatcher; store the record
   with its operations (and, when the handlers ran, the slot's committed count of the
   message); COMMIT. An optimistic duplicate that loses on the primary key rolls back its
   business work here. A step that consumes the message (does not call ``next``) leaves a
   record without operations: the message is not run again.
3. Dispatch, outside the business transaction: in the same round trip as the COMMIT, a second
   transaction on the business connection inserts the operations into their one queue and
   marks the record dispatched. Otherwise (several queues, delayed or large operations, a
   duplicate, a dispatch that failed after the business commit) on the receive connection (the
   unit's executor), where the record is locked and, unless already dispatched, its operations
   inserted and the record marked.

The strategy (``transactions.outbox_receive``) then commits the ack, or leaves it waiting when
the dispatch went with the business commit (:attr:`OutboxUnit.dispatched`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

import asyncpg
import structlog

from endpoint_runtime.chain.context import HandlerConnection, OutgoingDispatcher, parse_address
from endpoint_runtime.chain.outbox.storage import (
    OutboxStorage,
    TransportOperation,
    decode_operations,
    delayed_operation_of,
    encode_operations,
    operation_of,
)
from endpoint_runtime.chain.outgoing import as_delayed
from endpoint_runtime.chain.pipeline import IncomingContext, Next, ProcessingStats, Unit
from endpoint_runtime.delayed.store import DelayedMessage, DelayedMessageStore
from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.settings import OutboxSettings
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import (
    QUERY_ERRORS,
    DatabaseConnection,
    in_transaction,
    is_lost,
    prepared_name,
)
from endpoint_runtime.transport.literals import (
    bytea_literal,
    float_literal,
    inline_parameters,
    text_literal,
)
from endpoint_runtime.transport.sending import STATEMENT_SIZE_LIMIT, Executor, row_id
from endpoint_runtime.wire.messages import OutgoingMessage, encode_headers

log = structlog.get_logger("endpoint_runtime.chain.outbox.storage")
DISPATCH_PARAMETER_TYPES = "text, uuid[], float8[], text[], bytea[]"
DISPATCH_LOCK_TIMEOUT = "5s"  # a dispatch on B waits no longer for a lock (see ack_group)


class Collected(Protocol):
    """The unit's dispatcher in outbox mode: it keeps the operations for the record."""

    pending: list[tuple[QueueAddress, OutgoingMessage]]
    pending_delayed: list[DelayedMessage]


class Counts(Protocol):
    """The receive slot's committed counts (``transactions.counting.SlotCounts``)."""

    async def statement(self, connection: DatabaseConnection, *, processed: int = 0,
                        failed: int = 0) -> str: ...


class OutboxUnit(Unit):
    """What the outbox's receive provides: the receive connection (``executor``), the
    business connection, what the receive found out about the message id (``recorded``,
    ``None``: nothing), the slot's committed counts (a handled message is counted with its
    record, so a redelivered one is not counted again), and, once the steps ran, whether the
    dispatch went with the business commit (``dispatched``)."""

    __slots__ = ("business", "counts", "dispatched", "recorded")

    def __init__(self, executor: Executor, dispatcher: OutgoingDispatcher,
                 connection: HandlerConnection, business: DatabaseConnection,
                 recorded: bool | None, counts: Counts | None = None) -> None:
        super().__init__(executor, dispatcher, connection)
        self.business = business
        self.recorded = recorded
        self.counts = counts
        self.dispatched = False


def _array(literals: Iterable[str]) -> str:
    return f"ARRAY[{', '.join(literals)}]"


class OutboxStep:
    """Deduplication and dispatch (see the module docstring)."""

    name = "outbox"

    def __init__(self, storage: OutboxStorage, settings: OutboxSettings, *,
                 schema: str, delayed_store: DelayedMessageStore | None,
                 stats: ProcessingStats) -> None:
        self.storage = storage
        self.settings = settings
        self.schema = schema
        self.delayed_store = delayed_store
        self.stats = stats
        self.handler_runs = 0
        """Business transactions begun (the steps after this one ran)."""
        self.duplicates = 0

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        unit = context.unit
        assert isinstance(unit, OutboxUnit), "the outbox step needs the outbox's receive"
        message_id = context.transport_message.message_id
        dispatched = await self._business_transaction(context, unit, next)
        if not dispatched:
            await self.dispatch(unit.executor, message_id)
        unit.dispatched = dispatched

    async def _business_transaction(
        self, context: IncomingContext, unit: OutboxUnit, next: Next
    ) -> bool:
        """The steps after this one and the outbox record commit together; then, in the
        same round trip, the dispatch when it can go there. Returns whether the operations
        were dispatched: ``False`` when they are still to be (by the receive transaction),
        and for a duplicate (the steps did not run, or their work rolled back). A failure of
        the steps is raised, their work rolled back.

        Optimistic mode chains transactions as the receive does: the COMMIT goes with the
        next BEGIN, so the next message's business work starts without a round trip."""
        business, message_id = unit.business, context.transport_message.message_id
        pessimistic = self.settings.pessimistic
        isolation = self.settings.isolation.replace("_", " ").upper()
        begin = f"BEGIN ISOLATION LEVEL {isolation}"
        carried = in_transaction(business)
        steps_failed = False
        try:
            if pessimistic:
                duplicate = not await self.storage.claim(business, message_id, begin=begin)
            elif unit.recorded is None:
                duplicate = await self.storage.look_up(
                    business, message_id, begin=None if carried else begin)
            else:
                duplicate = unit.recorded
                if not duplicate and not carried:
                    await business.execute(begin)
            if duplicate:  # recorded by an earlier delivery
                await _rollback(business)
                self._count_duplicate("pessimistic" if pessimistic else "optimistic")
                return False
            self.handler_runs += 1
            steps_failed = True
            await next(context)
            steps_failed = False
            collected: Collected = context.dispatcher  # type: ignore[assignment]
            operations = [operation_of(a, m) for a, m in collected.pending]
            operations += [delayed_operation_of(d) for d in collected.pending_delayed]
            # No operation: the record is stored dispatched, there is nothing to dispatch.
            dispatch = (await self._dispatch_statement(business, message_id, operations)
                        if operations else None)
            count = (await unit.counts.statement(business, processed=1)
                     if unit.counts is not None and context.handlers_ran else "")
            then = "; ".join(part for part in (count, "COMMIT", dispatch) if part)
            try:
                await self.storage.record_and_commit(
                    business, message_id, encode_operations(operations), pessimistic=pessimistic,
                    dispatched=not operations, then=then if pessimistic else f"{then}; {begin}",
                )
            except asyncpg.UniqueViolationError as exc:
                if exc.table_name != self.storage.table.table:
                    raise
                # An optimistic duplicate lost the race: its business work rolls back.
                await _rollback(business)
                self._count_duplicate("optimistic")
                return False
            return not operations or dispatch is not None
        except BaseException as exc:
            await _rollback(business)
            if (not steps_failed and isinstance(exc, Exception)
                    and await self._committed(business, message_id)):
                # The business transaction committed, its dispatch failed: A dispatches.
                log.warning("outbox_dispatch_after_commit_failed",
                            error=f"{type(exc).__name__}: {exc}")
                return False
            raise

    def _count_duplicate(self, concurrency: str) -> None:
        self.duplicates += 1
        self.stats.outbox_duplicates += 1
        log.info("outbox_duplicate", concurrency=concurrency)

    async def _committed(self, business: DatabaseConnection, message_id: str) -> bool:
        """After a failure: whether the record of ``message_id`` is committed (so the
        business transaction did commit). ``False`` when that cannot be told."""
        if is_lost(business):
            return False
        with contextlib.suppress(*QUERY_ERRORS):
            return await self.storage.look_up(business, message_id, begin=None)
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
        operations, large messages). Behind a transaction-mode pooler the statement carries its
        values itself (no prepared statement)."""
        if not self._dispatch_in_one_statement(operations):
            return None
        ids = [row_id(o.message_id) for o in operations]
        ttbrs = [o.time_to_be_received for o in operations]
        headers = [encode_headers(o.headers) for o in operations]
        bodies = [o.body for o in operations]
        if sum(map(len, headers)) + sum(map(len, bodies)) > STATEMENT_SIZE_LIMIT:
            return None
        destination = parse_address(operations[0].destination, self.schema)
        try:
            name = await prepared_name(business, self.storage.dispatch_and_mark(destination),
                                       DISPATCH_PARAMETER_TYPES)
        except asyncpg.UndefinedTableError as exc:
            # The failed PREPARE aborted the business transaction: the message fails here,
            # naming the queue (else the record's INSERT would only say "aborted").
            raise QueueNotFoundError(str(destination)) from exc
        asynchronous = ("" if self.settings.synchronous_acks
                        else "SET LOCAL synchronous_commit = off; ")
        values = (text_literal(message_id),
                  f"{_array(text_literal(str(i)) for i in ids)}::uuid[]",
                  f"{_array('NULL' if t is None else float_literal(t) for t in ttbrs)}::float8[]",
                  f"{_array(text_literal(h) for h in headers)}::text[]",
                  f"{_array(bytea_literal(b) for b in bodies)}::bytea[]")
        statement = (inline_parameters(self.storage.dispatch_and_mark(destination), values)
                     .strip().rstrip(";") if name is None
                     else f"EXECUTE {name}({', '.join(values)})")
        return (f"BEGIN; {asynchronous}SET LOCAL lock_timeout = '{DISPATCH_LOCK_TIMEOUT}'; "
                f"{statement}; COMMIT")

    async def dispatch(self, connection: Executor, message_id: str) -> None:
        """Dispatch a stored record's operations and mark it dispatched, once."""
        assert not isinstance(connection, asyncpg.Pool), "in the receive transaction"
        row = await connection.fetchrow(self.storage.sql["take_for_dispatch"], message_id)
        if row is None:
            return  # dispatched already (by an earlier delivery or a competing duplicate)
        by_queue: dict[QueueAddress, list[OutgoingMessage]] = defaultdict(list)
        for operation in decode_operations(row["operations"]):
            address = parse_address(operation.destination, self.schema)
            outgoing = OutgoingMessage(
                message_id=operation.message_id, headers=operation.headers,
                body=operation.body, time_to_be_received=operation.time_to_be_received,
            )
            if operation.due is None:
                by_queue[address].append(outgoing)
                continue
            store = self.delayed_store
            assert store is not None, "delayed operations need a delayed-message store"
            due = dt.datetime.fromisoformat(operation.due)
            await store.store(connection, as_delayed(address, outgoing, due))
        for address, messages in by_queue.items():
            await sending.send_many(connection, address, messages)


async def _rollback(business: DatabaseConnection) -> None:
    if in_transaction(business):
        with contextlib.suppress(*QUERY_ERRORS):
            await business.execute("ROLLBACK")
