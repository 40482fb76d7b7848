"""The receive pipeline of one message, without Ray and without SQL text.

decode (msgspec) -> handlers in registration order -> outcome, with per-message log context,
processing start/end times, and the recoverability moves (delayed retry, error queue, discard).
Transaction strategies (``endpoint_runtime.transactions``) decide which connection and
transaction each step runs in.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import asyncpg
import structlog

from endpoint_runtime.context import HandlerConnection, HandlerContext, OutgoingDispatcher
from endpoint_runtime.delayed.store import DelayedMessage, DelayedMessageStore
from endpoint_runtime.errors import RecoverabilityFailedError, UnknownMessageTypeError
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
    error_copy,
)
from endpoint_runtime.serialization import message_type_name
from endpoint_runtime.subscriptions import SubscriptionStore
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.sending import Executor

log = structlog.get_logger("endpoint_runtime.pipeline")


class ProcessingStats:
    """Counters a receiver reports to the peeker (and, later, to metrics)."""

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
        self._failed_handler_limits: dict[uuid.UUID, RetryLimits] = {}

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
        )

    async def handle(self, message: TransportMessage, context: HandlerContext) -> None:
        """Decode the body and run every handler of its type, in registration order; then,
        with the audit queue set, hand the audit copy to the context's dispatcher (so it
        commits with the receive in atomic modes and with the dispatch in outbox mode)."""
        enclosed = message.headers.get(Headers.ENCLOSED_MESSAGE_TYPES, "")
        message_type = self.registry.message_types.resolve(enclosed)
        body = self.registry.message_types.decode(message_type, message.body)
        handlers = self.registry.handlers_for(message_type)
        if not handlers:
            raise UnknownMessageTypeError(enclosed)
        started = time.time()
        self.stats.last_started = context.processing_started = started
        for handler in handlers:
            try:
                await handler(body, context)
            except Exception:
                self._failed_handler_limits[message.native_id] = self.registry.limits_for(handler)
                raise
        ended = time.time()
        self.stats.last_ended = context.processing_ended = ended
        if self.audit_address is not None:
            await context.dispatch_audit_copy(self.audit_address)
        self.stats.processing_seconds += ended - started
        self.stats.processed += 1
        self.metrics.processed(self._type_tag(message_type), started, ended, message.headers)
        self.stats.consecutive_failures = 0

    def record_failure(self, message: TransportMessage, exc: BaseException) -> Failure:
        limits = self._failed_handler_limits.pop(message.native_id, RetryLimits())
        failure = self.failures.record(
            message.native_id, exc, unrecoverable=self.policy.is_unrecoverable(exc),
            limits=limits,
        )
        self.stats.failed += 1
        self.stats.consecutive_failures += 1
        next_step = self.policy.decide(failure, message.headers).action
        self.metrics.failed(self._type_tag_of(message),
                            immediate_retry=next_step is Action.IMMEDIATE_RETRY)
        log.warning(
            "message_failed",
            error=f"{failure.exception_type}: {failure.message[:500]}",
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
    ) -> None:
        """Carry out a delayed retry, an error-queue move or a discard (the message is
        consumed by the caller's commit)."""
        failure = self.failures.get(message.native_id)
        assert failure is not None, "a decision needs a recorded failure"
        try:
            if decision.action is Action.DISCARD:
                self.stats.discarded += 1
                log.warning("message_discarded", reason=failure.discard_reason)
            elif decision.action is Action.DELAYED_RETRY and self.delayed_store is not None:
                await self._store_delayed_retry(executor, message, decision.delay)
            else:
                await self.move_to_error_queue(executor, message, failure)
        except Exception as exc:
            raise RecoverabilityFailedError(message.native_id) from exc
        self.failures.forget(message.native_id)

    async def move_to_error_queue(
        self, executor: Executor, message: TransportMessage, failure: Failure
    ) -> None:
        copy = error_copy(message, failure, str(self.local_address), self.endpoint)
        await sending.send_failed(executor, self.error_address, message.native_id,
                                  copy.headers, copy.body)
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
        log.warning("delayed_retry_scheduled", delay_s=round(delay, 3),
                    retry=headers["NServiceBus.Retries"])

    async def move_poison_to_error_queue(self, executor: Executor, message: PoisonMessage) -> None:
        """Headers that do not parse: the raw row goes to the error queue as it is."""
        try:
            await sending.send_failed(
                executor, self.error_address, message.native_id, message.raw_headers,
                message.body,
            )
        except Exception as exc:
            raise RecoverabilityFailedError(message.native_id) from exc
        self.stats.moved_to_error += 1
        self.metrics.moved_to_error(UNKNOWN_TYPE)
        log.error("probable message metadata corruption", native_id=str(message.native_id),
                  reason=message.reason, error_queue=str(self.error_address))
