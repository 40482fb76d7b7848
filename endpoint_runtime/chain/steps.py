"""The built-in steps of the chain (``endpoint_runtime.chain.pipeline``), one job each.

Each is ``async def __call__(context, next)`` with a ``name``; their order and who adds which is
in :meth:`endpoint_runtime.runtime.endpoint.Endpoint.create_pipeline`. Recoverability's own step,
the
largest, is in :mod:`endpoint_runtime.chain.recoverability.step`; the outbox's next to its storage.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, Protocol

from endpoint_runtime.chain.context import CURRENT_CONTEXT, HandlerContext
from endpoint_runtime.chain.handlers import Handler, HandlerRegistry, cascade, handler_name
from endpoint_runtime.chain.metrics import UNKNOWN_TYPE, Metrics
from endpoint_runtime.chain.pipeline import IncomingContext, Next, ProcessingStats
from endpoint_runtime.chain.recoverability.policy import FailedMessages
from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.chain.subscriptions import SubscriptionStore
from endpoint_runtime.errors import HandlerTimeoutError, UnknownMessageTypeError
from endpoint_runtime.logging import bind_message_context
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import (
    MACHINE,
    Headers,
    OutgoingMessage,
    TransportMessage,
    new_message_id,
    to_wire_time,
)
from endpoint_runtime.wire.serialization import message_type_name


class TypeTags:
    """The metrics tag of a message type: a registered type's wire name, else "unknown"
    (header text from outside never becomes a tag)."""

    def __init__(self, registry: HandlerRegistry) -> None:
        self._registry = registry
        self._tags: dict[type, str] = {}

    def of_type(self, message_type: type | None) -> str:
        if message_type is None:
            return UNKNOWN_TYPE
        tag = self._tags.get(message_type)
        if tag is None:  # registered types only: a bounded set
            tag = self._tags[message_type] = message_type_name(message_type)
        return tag

    def of(self, message: TransportMessage) -> str:
        try:
            return self.of_type(self._registry.message_types.resolve(
                message.headers.get(Headers.ENCLOSED_MESSAGE_TYPES, "")))
        except UnknownMessageTypeError:
            return UNKNOWN_TYPE


class LogContextStep:
    """The per-message log context (endpoint, message id, attempt); see
    :func:`endpoint_runtime.logging.bind_message_context`."""

    name = "log_context"

    def __init__(self, endpoint: str, failures: FailedMessages) -> None:
        self.endpoint = endpoint
        self.failures = failures

    def __call__(self, context: IncomingContext, next: Next) -> Awaitable[None]:
        message = context.message
        failure = self.failures.get(message.native_id) if self.failures else None
        bind_message_context(
            self.endpoint,
            message.message_id if isinstance(message, TransportMessage) else str(message.native_id),
            (failure.attempts if failure else 0) + 1,
        )
        return next(context)  # no frame of its own: the next step's coroutine


class InFlight(Protocol):
    """Where a receiver notes the messages in its steps (``actors.crash_ledger``)."""

    def enter(self, native_id: uuid.UUID) -> int | None: ...

    def leave(self, record: int | None) -> None: ...


class CrashLedgerStep:
    """The message's native id is noted while it is in the steps below, in a record that
    outlives the process: the peeker finds the messages whose handling killed receivers."""

    name = "crash_ledger"

    def __init__(self, ledger: InFlight) -> None:
        self.ledger = ledger

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        record = self.ledger.enter(context.message.native_id)
        try:
            await next(context)
        finally:
            self.ledger.leave(record)


class MetricsStep:
    """Counts a message whose handlers ran as processed, with its processing time, once its
    work committed (an attempt whose commit fails is a failed attempt, never a processed
    one). Failures are counted by recoverability, with the same ``stats`` and ``metrics``."""

    name = "metrics"

    def __init__(self, stats: ProcessingStats, metrics: Metrics, tags: TypeTags) -> None:
        self.stats = stats
        self.metrics = metrics
        self.tags = tags

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        await next(context)
        if context.ended is not None:
            context.unit.handled = True
            context.unit.after_commit(functools.partial(self._processed, context))

    def _processed(self, context: IncomingContext) -> None:
        started, ended = context.started, context.ended
        assert started is not None
        assert ended is not None
        stats = self.stats
        stats.processing_seconds += ended - started
        stats.processed += 1
        stats.consecutive_failures = 0
        self.metrics.processed(self.tags.of_type(context.message_type), started, ended,
                               context.headers)


class AuditStep:
    """Once the handlers ran, the audit copy goes to the context's dispatcher: it commits
    with the receive in atomic modes and with the dispatch in outbox mode."""

    name = "audit"

    def __init__(self, endpoint: str, audit_address: QueueAddress) -> None:
        self.endpoint = endpoint
        self.audit_address = audit_address

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        await next(context)
        if context.ended is not None:
            await context.dispatcher.dispatch(
                self.audit_address, audit_copy(context, self.endpoint), immediate=False)


AUDIT_HEADERS = "audit_headers"
"""``context.items[AUDIT_HEADERS]``: headers a step adds to the audit copy (the saga step's)."""


def audit_copy(context: IncomingContext, endpoint: str) -> OutgoingMessage:
    """The handled message with its processing headers, and those steps left under
    ``context.items[AUDIT_HEADERS]``, under a row id of its own (a message processed twice is
    audited twice)."""
    message = context.transport_message
    headers = dict(message.headers)
    headers.update(context.items.get(AUDIT_HEADERS, ()))
    headers[Headers.PROCESSING_ENDPOINT] = endpoint
    headers[Headers.PROCESSING_MACHINE] = MACHINE
    for name, moment in ((Headers.PROCESSING_STARTED, context.started),
                         (Headers.PROCESSING_ENDED, context.ended)):
        if moment is not None:
            headers[name] = to_wire_time(datetime.fromtimestamp(moment, UTC))
    return OutgoingMessage(message_id=new_message_id(), headers=headers, body=message.body,
                           time_to_be_received=None)


class InvokeHandlersStep:
    """Resolve the type from ``EnclosedMessageTypes``, decode the body and run every handler
    of the type in registration order with a :class:`HandlerContext` (the context's
    dispatcher and connection; sends checked to name queue tables). Always the last step."""

    name = "invoke_handlers"

    def __init__(
        self, *, endpoint: str, registry: HandlerRegistry, local_address: QueueAddress,
        error_address: QueueAddress, subscriptions: SubscriptionStore | None,
        allowed_schemas: frozenset[str] | None, metrics: Metrics,
        routes: RouteTable | None = None, handler_timeout: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.routes = routes
        self.handler_timeout = handler_timeout
        self.registry = registry
        self.local_address = local_address
        self.error_address = error_address
        self.subscriptions = subscriptions
        self.allowed_schemas = allowed_schemas
        self.metrics = metrics

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        message = context.transport_message
        types = self.registry.message_types
        enclosed = message.headers.get(Headers.ENCLOSED_MESSAGE_TYPES, "")
        message_type = context.message_type = types.resolve(enclosed)
        body = types.decode(message_type, message.body)
        handlers = self.registry.handlers_for(message_type)
        if not handlers:
            raise UnknownMessageTypeError(enclosed)
        handler_context = HandlerContext(
            message=message, endpoint=self.endpoint, local_address=self.local_address,
            dispatcher=context.dispatcher, connection=context.connection,
            subscriptions=self.subscriptions, allowed_schemas=self.allowed_schemas,
            error_address=self.error_address, metrics=self.metrics,
            outgoing_hooks=context.outgoing_hooks, items=context.items, routes=self.routes,
        )
        context.started = time.time()
        token = CURRENT_CONTEXT.set(handler_context)
        try:
            for handler in handlers:
                context.limits = self.registry.limits_for(handler)
                if self.handler_timeout is None:
                    returned = await self.registry.start(handler, body, handler_context)
                else:
                    returned = await self._limited(handler, body, handler_context,
                                                   self.handler_timeout)
                if returned is not None:
                    await cascade(handler_context, returned, handler)
        finally:
            CURRENT_CONTEXT.reset(token)
        context.limits = None
        context.ended = time.time()
        # The last step by construction: nothing after it to call.

    async def _limited(self, handler: Handler, body: Any, context: HandlerContext,
                       seconds: float) -> Any:
        """``handler`` on ``body``, cancelled past ``seconds``: :class:`HandlerTimeoutError`
        (a ``TimeoutError`` the handler raised itself stays what it is)."""
        limit = asyncio.timeout(seconds)
        try:
            async with limit:
                return await self.registry.start(handler, body, context)
        except TimeoutError:
            if limit.expired():
                raise HandlerTimeoutError(handler_name(handler), seconds) from None
            raise
