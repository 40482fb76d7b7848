"""The path of one message, without Ray and without SQL text.

:meth:`Pipeline.process` takes a received message through every step, in this order:

1. the per-message log context (endpoint, message id, attempt);
2. **screen**: headers that do not parse move the raw row to the error queue; a message whose
   failures recoverability has given up on (or has a delayed retry for) is moved, not handled;
3. **handle**: decode the body, run every handler of its type in registration order (the
   receiver-death ledger holds the native id meanwhile), then the audit copy; a failure is
   counted here, with the retry limits of the handler that raised.

It returns an :class:`Outcome`. A transaction strategy (``endpoint_runtime.transactions``) owns
only where the transaction begins and ends around it: it commits after ``CONSUMED`` and
``HANDLED`` (then calls :meth:`Pipeline.succeeded`) and rolls back after ``FAILED``; a failure of
the commit itself is charged with :meth:`Pipeline.failed`. The outbox, whose handlers run in a
business transaction of their own, calls the two halves (:meth:`screen`, :meth:`handle`).
"""

from __future__ import annotations

import enum
import time
import uuid
from datetime import timedelta
from typing import Protocol

import asyncpg
import structlog

from endpoint_runtime import error_queue
from endpoint_runtime.context import HandlerConnection, HandlerContext, OutgoingDispatcher
from endpoint_runtime.delayed.store import DelayedMessage, DelayedMessageStore
from endpoint_runtime.errors import (
    QueueNotFoundError,
    RecoverabilityFailedError,
    TransactionAbortedError,
    UnknownMessageTypeError,
)
from endpoint_runtime.handlers import HandlerRegistry
from endpoint_runtime.logging import bind_message_context
from endpoint_runtime.messages import (
    Headers,
    PoisonMessage,
    TransportMessage,
    encode_headers,
    to_wire_time,
    utc_now,
)
from endpoint_runtime.metrics import UNKNOWN_TYPE, Metrics
from endpoint_runtime.recoverability import (
    Action,
    Decision,
    FailedMessages,
    Failure,
    RecoverabilityPolicy,
    RetryLimits,
    delayed_retry_headers,
)
from endpoint_runtime.serialization import message_type_name
from endpoint_runtime.subscriptions import SubscriptionStore
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.sending import Executor

log = structlog.get_logger("endpoint_runtime.pipeline")


CONNECTION_LOSS = (
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08: the connection does not exist...
    asyncpg.OperatorInterventionError,  # 57: terminated by an administrator, shutdown
    ConnectionError,
)
"""Errors of the handlers' connection, not of the message: raised to the receive loop."""


class Outcome(enum.Enum):
    """How :meth:`Pipeline.process` left a message."""

    HANDLED = "handled"
    """Handlers ran: commit (with the outgoing messages), then ``succeeded``."""
    CONSUMED = "consumed"
    """Moved by recoverability (delayed retry, discard): commit."""
    MOVED_TO_ERROR = "moved_to_error"
    """Moved to the error queue (recoverability gave up, or a poison row): commit; it counts
    as failed in the committed counts (``transactions.counting``)."""
    FAILED = "failed"
    """An attempt failed and was counted: roll back (the row comes back)."""


class InFlight(Protocol):
    """Where a receiver notes the messages in its handlers (``actors.crash_ledger``)."""

    def enter(self, native_id: uuid.UUID) -> int | None: ...

    def leave(self, record: int | None) -> None: ...


class NothingInFlight:
    def enter(self, native_id: uuid.UUID) -> int | None:
        return None

    def leave(self, record: int | None) -> None:
        return None


class ProcessingStats:
    """Counters a receiver reports to the peeker (and, later, to metrics); ``processed``
    counts messages whose work committed."""

    def __init__(self) -> None:
        self.processed = 0
        self.failed = 0
        self.moved_to_error = 0
        self.delayed_retries = 0
        self.discarded = 0
        self.consecutive_failures = 0
        self.processing_seconds = 0.0
        self.last_started = 0.0
        """Epoch seconds at which the last handled message's handlers started."""
        self.last_ended = 0.0


class HandledAwaitingCommit:
    """Messages whose handlers returned, by native id, until their work commits
    (:meth:`Pipeline.succeeded` counts them then) or fails (:meth:`Pipeline.failed` drops
    them). Bounded: an entry whose round never ended (a lost connection, a batch another
    receiver took over) is dropped, oldest first, past ``limit``."""

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._entries: dict[uuid.UUID, tuple[str, float, float]] = {}

    def note(self, native_id: uuid.UUID, handled: tuple[str, float, float]) -> None:
        self._entries.pop(native_id, None)
        self._entries[native_id] = handled
        if len(self._entries) > self._limit:
            del self._entries[next(iter(self._entries))]

    def take(self, native_id: uuid.UUID) -> tuple[str, float, float] | None:
        return self._entries.pop(native_id, None)

    def __len__(self) -> int:
        return len(self._entries)


class Pipeline:
    """Runs handlers for messages of one endpoint and applies recoverability."""

    def __init__(
        self,
        *,
        endpoint: str,
        registry: HandlerRegistry,
        local_address: QueueAddress,
        error_address: QueueAddress,
        policy: RecoverabilityPolicy,
        delayed_store: DelayedMessageStore | None = None,
        subscriptions: SubscriptionStore | None = None,
        audit_address: QueueAddress | None = None,
        allowed_schemas: frozenset[str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.subscriptions = subscriptions
        self.audit_address = audit_address
        self.allowed_schemas = allowed_schemas
        """Schemas whose queues handlers may send to (``None``: any; see
        ``transport.queue_tables``)."""
        self.registry = registry
        self.local_address = local_address
        self.error_address = error_address
        self.policy = policy
        self.delayed_store = delayed_store
        self.failures = FailedMessages()
        self.stats = ProcessingStats()
        self.metrics = Metrics()
        """Replaced by :class:`~endpoint_runtime.metrics.RayMetrics` in receiver actors."""
        self._type_tags: dict[type, str] = {}
        self._handled = HandledAwaitingCommit()
        self.in_flight: InFlight = NothingInFlight()
        """Replaced by the receiver-death ledger in receiver actors."""

    def bind_log_context(self, message: TransportMessage | PoisonMessage) -> None:
        """Per-message log context (endpoint, message_id, attempt); see
        :func:`endpoint_runtime.logging.bind_message_context`."""
        failure = self.failures.get(message.native_id) if self.failures else None
        bind_message_context(
            self.endpoint,
            message.message_id if isinstance(message, TransportMessage) else str(message.native_id),
            (failure.attempts if failure else 0) + 1,
        )

    def _type_tag(self, message_type: type) -> str:
        tag = self._type_tags.get(message_type)
        if tag is None:  # registered types only: a bounded set
            tag = self._type_tags[message_type] = message_type_name(message_type)
        return tag

    def _type_tag_of(self, message: TransportMessage) -> str:
        """The metrics tag of a message's type: a registered type's name, else "unknown"."""
        try:
            return self._type_tag(self.registry.message_types.resolve(
                message.headers.get(Headers.ENCLOSED_MESSAGE_TYPES, "")))
        except UnknownMessageTypeError:
            return UNKNOWN_TYPE

    def new_context(
        self, message: TransportMessage, dispatcher: OutgoingDispatcher,
        connection: HandlerConnection | None,
    ) -> HandlerContext:
        """What the handlers of ``message`` see; ``dispatcher`` takes their outgoing messages
        (and the audit copy) the way the transaction mode wants."""
        return HandlerContext(
            message=message, endpoint=self.endpoint, local_address=self.local_address,
            dispatcher=dispatcher, connection=connection, subscriptions=self.subscriptions,
            allowed_schemas=self.allowed_schemas,
            error_address=self.error_address, metrics=self.metrics,
        )

    async def process(
        self, received: TransportMessage | PoisonMessage, executor: Executor,
        dispatcher: OutgoingDispatcher, connection: HandlerConnection | None,
    ) -> Outcome:
        """Every step of one message (see the module docstring). ``executor`` runs the moves of
        recoverability (the receive transaction's connection); ``dispatcher`` takes the
        handlers' outgoing messages and ``connection`` is theirs, as the mode wants."""
        self.bind_log_context(received)
        screened = await self.screen(received, executor)
        if screened is not None:
            return screened
        assert isinstance(received, TransportMessage)
        return await self.handle(received, self.new_context(received, dispatcher, connection))

    async def screen(
        self, received: TransportMessage | PoisonMessage, executor: Executor
    ) -> Outcome | None:
        """Poison rows and messages recoverability has decided on are moved here
        (``CONSUMED``, ``MOVED_TO_ERROR``); ``None``: handle the message."""
        if isinstance(received, PoisonMessage):
            await self.move_poison_to_error_queue(executor, received)
            return Outcome.MOVED_TO_ERROR
        decision = self.pending_decision(received)
        if decision is None:
            return None
        return await self.apply_decision(executor, received, decision)

    async def handle(self, message: TransportMessage, context: HandlerContext) -> Outcome:
        """Decode the body and run every handler of its type, in registration order; then,
        with the audit queue set, hand the audit copy to the context's dispatcher (so it
        commits with the receive in atomic modes and with the dispatch in outbox mode).

        A failure is counted (``FAILED``) unless the handlers' connection was lost: that is
        the transport's failure, raised to the receive loop's circuit breaker.
        """
        limits = RetryLimits()
        record = self.in_flight.enter(message.native_id)
        try:
            enclosed = message.headers.get(Headers.ENCLOSED_MESSAGE_TYPES, "")
            message_type = self.registry.message_types.resolve(enclosed)
            body = self.registry.message_types.decode(message_type, message.body)
            handlers = self.registry.handlers_for(message_type)
            if not handlers:
                raise UnknownMessageTypeError(enclosed)
            started = time.time()
            self.stats.last_started = context.processing_started = started
            for handler in handlers:
                limits = self.registry.limits_for(handler)
                await handler(body, context)
            limits = RetryLimits()
            ended = time.time()
            self.stats.last_ended = context.processing_ended = ended
            if self.audit_address is not None:
                await context.dispatch_audit_copy(self.audit_address)
        except Exception as exc:
            if context.connection_lost() or isinstance(exc, CONNECTION_LOSS):
                raise
            self.failed(message, exc, limits)
            return Outcome.FAILED
        finally:
            self.in_flight.leave(record)
        self._handled.note(message.native_id, (self._type_tag(message_type), started, ended))
        return Outcome.HANDLED

    def succeeded(self, message: TransportMessage) -> None:
        """The message's work committed: its failure count goes, and it counts as processed
        (``stats.processed``, the ``messages_processed`` metric) now, not when the handlers
        returned: an attempt whose commit fails is a failed attempt, never a processed one."""
        self.failures.forget(message.native_id)
        handled = self._handled.take(message.native_id)
        if handled is None:
            return  # not handled by this pipeline (a duplicate the outbox skipped)
        type_tag, started, ended = handled
        self.stats.processing_seconds += ended - started
        self.stats.processed += 1
        self.metrics.processed(type_tag, started, ended, message.headers)
        self.stats.consecutive_failures = 0

    def failed(
        self, message: TransportMessage, exc: BaseException,
        limits: RetryLimits | None = None,
    ) -> Failure:
        """Count a failed attempt (``limits``: those of the handler that raised). A database
        error "current transaction is aborted" is charged as :class:`TransactionAbortedError`:
        a handler caught an error without a savepoint."""
        exc = charged_exception(exc)
        if isinstance(exc, QueueNotFoundError) and self.subscriptions is not None:
            self.subscriptions.forget()  # a subscriber queue may be gone: read them again
        self._handled.take(message.native_id)  # its handlers' work did not commit
        failure = self.failures.record(
            message.native_id, exc, unrecoverable=self.policy.is_unrecoverable(exc),
            limits=limits or RetryLimits(),
        )
        self.stats.failed += 1
        self.stats.consecutive_failures += 1
        next_step = self.policy.decide(failure, message.headers).action
        self.metrics.failed(self._type_tag_of(message),
                            immediate_retry=next_step is Action.IMMEDIATE_RETRY)
        log.warning(
            "message_failed",
            error=failure.summary(),  # one line; the traceback once, with the last attempt
            attempts=failure.attempts,
            next_step=next_step.value,
            exc_info=exc if next_step is Action.ERROR_QUEUE else None,
        )
        return failure

    def pending_decision(self, message: TransportMessage) -> Decision | None:
        """What this delivery must do instead of handling, or ``None`` to handle it."""
        if not self.failures:
            return None
        failure = self.failures.get(message.native_id)
        if failure is None:
            return None
        decision = self.policy.decide(failure, message.headers)
        return None if decision.action is Action.IMMEDIATE_RETRY else decision

    async def apply_decision(
        self, executor: Executor, message: TransportMessage, decision: Decision
    ) -> Outcome:
        """Carry out a delayed retry, an error-queue move or a discard (the message is
        consumed by the caller's commit)."""
        failure = self.failures.get(message.native_id)
        assert failure is not None, "a decision needs a recorded failure"
        outcome = Outcome.CONSUMED
        try:
            if decision.action is Action.DISCARD:
                self.stats.discarded += 1
                log.warning("message_discarded", reason=failure.discard_reason)
            elif decision.action is Action.DELAYED_RETRY and self.delayed_store is not None:
                await self._store_delayed_retry(executor, message, decision.delay)
            else:
                await self.move_to_error_queue(executor, message, failure)
                outcome = Outcome.MOVED_TO_ERROR
        except Exception as exc:
            raise RecoverabilityFailedError(message.native_id) from exc
        self.failures.forget(message.native_id)
        return outcome

    async def give_up(self, executor: Executor, message: TransportMessage) -> Outcome:
        """At most once (``TransactionMode.NONE``): a failed message cannot be retried, so a
        copy goes to the error queue, unless the handler discarded it."""
        decision = self.pending_decision(message)
        if decision is None or decision.action is not Action.DISCARD:
            decision = Decision(Action.ERROR_QUEUE)
        return await self.apply_decision(executor, message, decision)

    async def move_to_error_queue(
        self, executor: Executor, message: TransportMessage, failure: Failure
    ) -> None:
        await error_queue.move_failed(executor, self.error_address, message, failure,
                                      str(self.local_address), self.endpoint)
        self.failures.forget(message.native_id)
        self.stats.moved_to_error += 1
        self.metrics.moved_to_error(self._type_tag_of(message))
        log.error("moved_to_error_queue", error_queue=str(self.error_address),
                  reason=failure.exception_type, attempts=failure.attempts)

    async def _store_delayed_retry(
        self, executor: Executor, message: TransportMessage, delay: float
    ) -> None:
        assert self.delayed_store is not None
        headers = delayed_retry_headers(message)
        due = utc_now() + timedelta(seconds=delay)
        headers[Headers.DELIVER_AT] = to_wire_time(due)
        delayed = DelayedMessage(
            id=message.native_id, destination=str(self.local_address), due=due,
            headers=encode_headers(headers), body=message.body,
        )
        if isinstance(executor, asyncpg.Pool):
            async with executor.acquire() as connection:
                await self.delayed_store.store(connection, delayed)
        else:
            await self.delayed_store.store(executor, delayed)
        self.stats.delayed_retries += 1
        self.metrics.delayed_retry(self._type_tag_of(message))
        # Info: the attempt's own warning (message_failed, next_step=delayed_retry) said it.
        log.info("delayed_retry_scheduled", delay_s=round(delay, 3),
                    retry=headers["NServiceBus.Retries"])

    async def move_poison_to_error_queue(self, executor: Executor, message: PoisonMessage) -> None:
        """Headers that do not parse: the raw row goes to the error queue as it is."""
        try:
            await error_queue.move_poison(executor, self.error_address, message)
        except Exception as exc:
            raise RecoverabilityFailedError(message.native_id) from exc
        self.stats.moved_to_error += 1
        self.metrics.moved_to_error(UNKNOWN_TYPE)
        log.error("probable message metadata corruption", native_id=str(message.native_id),
                  reason=message.reason, error_queue=str(self.error_address))


def charged_exception(exc: BaseException) -> BaseException:
    """The exception a failed attempt is charged with: "current transaction is aborted" from
    any statement after a handler caught a database error says too little, so it becomes a
    :class:`TransactionAbortedError` that says what to do."""
    if isinstance(exc, asyncpg.InFailedSQLTransactionError):
        aborted = TransactionAbortedError()
        aborted.__cause__ = exc
        return aborted
    return exc
