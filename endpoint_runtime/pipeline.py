"""The receive pipeline of one message, without Ray and without SQL text.

decode (msgspec) -> handlers in registration order -> outcome, with per-message log context,
processing start/end times, and the error-queue moves of recoverability. Transaction
strategies (``endpoint_runtime.transactions``) decide which connection and transaction each
step runs in.
"""

from __future__ import annotations

import time
from datetime import datetime

import asyncpg
import structlog

from endpoint_runtime.context import HandlerContext
from endpoint_runtime.errors import UnknownMessageTypeError
from endpoint_runtime.handlers import HandlerRegistry
from endpoint_runtime.messages import Headers, PoisonMessage, TransportMessage, utc_now
from endpoint_runtime.recoverability import (
    FailedMessages,
    Failure,
    RecoverabilityPolicy,
    error_copy,
)
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress

log = structlog.get_logger("endpoint_runtime.pipeline")


class ProcessingStats:
    """Counters a receiver reports to the peeker (and, later, to metrics)."""

    def __init__(self) -> None:
        self.processed = 0
        self.failed = 0
        self.moved_to_error = 0
        self.processing_seconds = 0.0
        self.last_started: datetime | None = None
        self.last_ended: datetime | None = None


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
    ) -> None:
        self.endpoint = endpoint
        self.registry = registry
        self.local_address = local_address
        self.error_address = error_address
        self.policy = policy
        self.failures = FailedMessages()
        self.stats = ProcessingStats()

    def bind_log_context(self, message: TransportMessage | PoisonMessage) -> None:
        structlog.contextvars.clear_contextvars()
        message_id = (
            message.message_id if isinstance(message, TransportMessage) else str(message.native_id)
        )
        failure = self.failures.get(message.native_id)
        structlog.contextvars.bind_contextvars(
            endpoint=self.endpoint,
            message_id=message_id,
            attempt=(failure.attempts if failure else 0) + 1,
        )

    async def handle(self, message: TransportMessage, context: HandlerContext) -> None:
        """Decode the body and run every handler of its type, in registration order."""
        enclosed = message.headers.get(Headers.ENCLOSED_MESSAGE_TYPES, "")
        message_type = self.registry.message_types.resolve(enclosed)
        body = self.registry.message_types.decode(message_type, message.body)
        handlers = self.registry.handlers_for(message_type)
        if not handlers:
            raise UnknownMessageTypeError(enclosed)
        started = time.perf_counter()
        self.stats.last_started = utc_now()
        for handler in handlers:
            await handler(body, context)
        self.stats.last_ended = utc_now()
        self.stats.processing_seconds += time.perf_counter() - started
        self.stats.processed += 1

    def record_failure(self, message: TransportMessage, exc: BaseException) -> Failure:
        failure = self.failures.record(
            message.native_id, exc, unrecoverable=self.policy.is_unrecoverable(exc)
        )
        self.stats.failed += 1
        will_retry = not self.policy.retries_exhausted(failure)
        log.warning(
            "message_failed",
            error=f"{failure.exception_type}: {failure.message[:500]}",
            attempts=failure.attempts,
            next_step="immediate_retry" if will_retry else "error_queue",
            exc_info=exc if not will_retry else None,
        )
        return failure

    def exhausted_failure(self, message: TransportMessage) -> Failure | None:
        """The failure record when this delivery must go to the error queue, else ``None``."""
        failure = self.failures.get(message.native_id)
        if failure is not None and self.policy.retries_exhausted(failure):
            return failure
        return None

    async def move_to_error_queue(
        self, executor: asyncpg.Connection | asyncpg.Pool, message: TransportMessage,
        failure: Failure,
    ) -> None:
        copy = error_copy(message, failure, str(self.local_address), self.endpoint)
        await sending.send(executor, self.error_address, copy)
        self.failures.forget(message.native_id)
        self.stats.moved_to_error += 1
        log.error("moved_to_error_queue", error_queue=str(self.error_address),
                  reason=failure.exception_type, attempts=failure.attempts)

    async def move_poison_to_error_queue(
        self, executor: asyncpg.Connection | asyncpg.Pool, message: PoisonMessage
    ) -> None:
        """Headers that do not parse: the raw row goes to the error queue as it is."""
        await sending.send_raw(
            executor, self.error_address, message.native_id, message.raw_headers, message.body
        )
        self.stats.moved_to_error += 1
        log.error("probable message metadata corruption", native_id=str(message.native_id),
                  reason=message.reason, error_queue=str(self.error_address))

