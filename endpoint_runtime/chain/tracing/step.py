"""The chain's ``tracing`` step: a span per attempt at a message.

Placed right after ``log_context`` (before recoverability, so that screening, failures and
recoverability's moves happen inside the span). The span, ``process <queue>`` (kind
consumer), continues the trace of the message's ``traceparent`` (see
:func:`.spans.incoming_parent`) and is the current span while the steps below and the
handlers run: the handlers' own spans and every message they send (through the outgoing hook,
:class:`.spans.OutgoingSpans`) are its children.

What recoverability did is on the span: a failed attempt's exception (recorded, status
error, ``error.type``) and ``nservicebus.recoverability_action`` (the next step after a
failure). A delayed retry and a move to the error queue get a short producer span of their
own (``delayed retry <queue>``, ``move to error <queue>``), children of the failed attempt's
span. The delivery that carries out such a decision (the failed attempt rolled back; the
message comes back and is moved instead of handled) makes no ``process`` span of its own: one
``process`` span per attempt, and the last attempt's is the one the error-queue copy and the
delayed retry name. A decision made without an attempt of this receiver (a receiver-death
verdict, or one whose attempt it no longer remembers) still gets a ``process`` span of its
own, the parent of the move.

A message whose sender was sampled out, under the SDK's parent-based samplers (which drop
its span anyway), gets no span of the SDK: the sender's context goes on as the current span,
unsampled (about 3 us less per message; its log lines then name the sender's span id).

The trace and span ids are bound in the log context (``trace_id``, ``span_id``) and written
into the received message's headers as ``EndpointRuntime.ProcessingTraceParent``: every copy
made of the message carries it, the audit copy (the span that processed it), the error-queue
copy and a delayed retry's copy (the last attempt). A message that arrives with that header (a
delayed retry, a message retried from the error queue, a replay of the same delivery) gets a
span **linked** to that attempt; so does a message an optimistic batch runs again after
rolling back to its checkpoint (``transactions.optimistic_batch``: the header the first run
wrote is still on the message).

A batched strategy enters :meth:`TracingStep.batch` around each batch: one receive span
(``receive <queue>``, kind client, ``messaging.operation.type`` ``receive``,
``messaging.batch.message_count``), a root of its own that covers the DELETE, and every
message's span of that batch **linked** to it (when it was sampled: a link to a span that no
backend receives would name nothing). An empty receive makes no span.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.span import format_span_id, format_trace_id

from endpoint_runtime.chain.pipeline import IncomingContext, Next, Outcome, ReceivedBatch
from endpoint_runtime.chain.recoverability.policy import FAILURE_CACHE_SIZE, Action
from endpoint_runtime.chain.tracing import attributes as names
from endpoint_runtime.chain.tracing.spans import (
    OutgoingSpans,
    drops_unsampled_parents,
    header_attributes,
    incoming_parent,
    record_failure,
    tracer,
)
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import TransportMessage

_bind = structlog.contextvars.bind_contextvars
FAILED_ATTEMPTS_KEPT = FAILURE_CACHE_SIZE
"""Failed attempts whose spans a tracing step remembers until their decisions are carried
out (as many as recoverability's failure records, ``FailedMessages``)."""
_BATCH: ContextVar[Link | None] = ContextVar("endpoint_runtime_received_batch", default=None)
"""The link to the receive span of the batch the current slot is running (a context variable:
the slots of a receiver are tasks of one event loop)."""


class TracingStep:
    """A span per attempt (see the module docstring)."""

    name = "tracing"

    def __init__(
        self, *, endpoint: str, local_address: QueueAddress, error_address: QueueAddress,
        tracer_: trace.Tracer | None = None,
        decided: Callable[[TransportMessage], bool] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.decided = decided
        """Whether recoverability will move a message instead of handling it (its failed
        attempt's decision: ``RecoverabilityStep.pending_decision``); ``None``: never asked."""
        self._failed_attempts: OrderedDict[uuid.UUID, SpanContext] = OrderedDict()
        """The span of each message's last failed attempt, until its decision is carried out
        (at most :data:`FAILED_ATTEMPTS_KEPT`, oldest dropped)."""
        self.queue = str(local_address)
        self.error_queue = str(error_address)
        self._name = f"process {self.queue}"
        self._receive_name = f"receive {self.queue}"
        self.use(tracer_ or tracer())

    def use(self, tracer_: trace.Tracer) -> None:
        """Make spans with ``tracer_`` (the process's by default; tests and benchmarks give
        their own)."""
        self.tracer = tracer_
        self.outgoing = OutgoingSpans(tracer_, self.endpoint)
        self._follows_parent = drops_unsampled_parents(tracer_)

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        message = context.message
        headers = message.headers if isinstance(message, TransportMessage) else None
        if (headers is not None and self._failed_attempts and self.decided is not None
                and message.native_id in self._failed_attempts
                and self.decided(message)):  # type: ignore[arg-type]
            await self._carry_out(context, next, headers)
            return
        if headers is not None:
            parent, links = incoming_parent(headers)
        else:  # a poison row: its headers did not parse
            parent, links = otel_context.get_current(), None
        sender = trace.get_current_span(parent).get_span_context()
        if (self._follows_parent and links is None and sender.is_remote
                and not sender.trace_flags.sampled):
            # The sampler would drop it (a parent-based one, its sender sampled out): skip
            # the SDK and carry the sender's context on, unsampled, as the current span.
            span: trace.Span = trace.NonRecordingSpan(sender)
        else:
            received = _BATCH.get()
            if received is not None:
                links = [*links, received] if links else [received]
            span = self.tracer.start_span(self._name, context=parent, kind=SpanKind.CONSUMER,
                                          links=links)
        if span.is_recording():  # attributes only for a sampled span: they cost the most
            span.set_attributes(self._attributes(context))
        ids = span.get_span_context()
        _processed_by(ids, headers)
        context.on_outgoing(self.outgoing)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            await next(context)
        except BaseException as exc:  # not counted by recoverability: the transport's, a stop
            record_failure(span, exc)
            raise
        finally:
            otel_context.detach(token)
            if span.is_recording():
                self._verdict(span, context)
            span.end()
            if headers is not None and self.decided is not None:
                self._remember(message.native_id, ids if context.failure is not None else None)

    def _remember(self, native_id: uuid.UUID, attempt: SpanContext | None) -> None:
        """Keep (or, ``None``, forget) the span of ``native_id``'s last failed attempt."""
        if attempt is None:
            self._failed_attempts.pop(native_id, None)
            return
        self._failed_attempts[native_id] = attempt
        self._failed_attempts.move_to_end(native_id)
        if len(self._failed_attempts) > FAILED_ATTEMPTS_KEPT:
            self._failed_attempts.popitem(last=False)

    async def _carry_out(self, context: IncomingContext, next: Next,
                         headers: dict[str, str]) -> None:
        """A delivery that carries out its failed attempt's decision: no span of its own;
        the move is a child of that attempt's span, which the copies name."""
        message = context.message
        attempt = self._failed_attempts[message.native_id]
        _processed_by(attempt, headers)
        parent = trace.NonRecordingSpan(attempt)
        token = otel_context.attach(trace.set_span_in_context(parent))
        try:
            await next(context)
        finally:
            otel_context.detach(token)
        if context.outcome is Outcome.CONSUMED and attempt.trace_flags.sampled:
            self._moved(parent, context)
        if context.outcome is Outcome.CONSUMED:
            self._failed_attempts.pop(message.native_id, None)

    def batch(self) -> TracedBatch:
        """The scope of one received batch (the chain's
        :meth:`~endpoint_runtime.chain.pipeline.Pipeline.batch`)."""
        return TracedBatch(self)

    def receive_span(self, started: int, count: int) -> trace.Span:
        """The ended receive span of a batch of ``count`` messages taken since ``started``
        (ns): a root, sampled on its own."""
        span = self.tracer.start_span(self._receive_name, context=Context(),
                                      kind=SpanKind.CLIENT, start_time=started)
        if span.is_recording():
            span.set_attributes({
                names.MESSAGING_SYSTEM: names.SYSTEM, names.OPERATION_TYPE: "receive",
                names.OPERATION_NAME: "receive", names.DESTINATION: self.queue,
                names.CONSUMER_GROUP: self.endpoint, names.BATCH_COUNT: count})
        span.end()
        return span

    def _attributes(self, context: IncomingContext) -> dict[str, Any]:
        message = context.message
        attributes = (header_attributes(message.headers, names.PROCESSED_HEADERS)
                      if isinstance(message, TransportMessage)
                      else {names.MESSAGING_SYSTEM: names.SYSTEM,
                            names.NATIVE_MESSAGE_ID: str(message.native_id)})
        attributes[names.OPERATION_TYPE] = attributes[names.OPERATION_NAME] = "process"
        attributes[names.DESTINATION] = self.queue
        attributes[names.CONSUMER_GROUP] = self.endpoint
        return attributes

    def _verdict(self, span: Any, context: IncomingContext) -> None:
        action = context.recoverability_action
        if context.failure is not None:
            record_failure(span, context.failure)
        if action is None:
            return
        span.set_attribute(names.RECOVERABILITY_ACTION, str(action))
        if context.outcome is Outcome.CONSUMED:
            self._moved(span, context)

    def _moved(self, span: Any, context: IncomingContext) -> None:
        """The producer span of the move a consumed delivery made, if any."""
        action = context.recoverability_action
        if action == Action.DELAYED_RETRY:
            self._move(span, context, "delayed retry", self.queue)
        elif action == Action.ERROR_QUEUE:
            self._move(span, context, "move to error", self.error_queue)

    def _move(self, span: Any, context: IncomingContext, operation: str, queue: str) -> None:
        message = context.message
        attributes = (header_attributes(message.headers)
                      if isinstance(message, TransportMessage) else {})
        attributes.update({names.MESSAGING_SYSTEM: names.SYSTEM, names.OPERATION_TYPE: "send",
                           names.OPERATION_NAME: operation, names.DESTINATION: queue})
        self.tracer.start_span(f"{operation} {queue}", context=trace.set_span_in_context(span),
                               kind=SpanKind.PRODUCER, attributes=attributes).end()


def _processed_by(span: SpanContext, headers: dict[str, str] | None) -> None:
    """Name ``span`` as the one processing the message: in the log context, and in the
    headers every copy of the message carries (audit, error queue, delayed retry)."""
    trace_id, span_id = format_trace_id(span.trace_id), format_span_id(span.span_id)
    _bind(trace_id=trace_id, span_id=span_id)
    if headers is not None:
        headers[names.PROCESSING_TRACEPARENT] = f"00-{trace_id}-{span_id}-{span.trace_flags:02x}"


class TracedBatch(ReceivedBatch):
    """One batch's scope (:meth:`TracingStep.batch`): from ``__enter__`` to :meth:`taken`
    the receive; the messages run inside the ``with`` link to its span."""

    __slots__ = ("_started", "_step", "_token")

    def __init__(self, step: TracingStep) -> None:
        self._step = step
        self._started = 0
        self._token: Any = None

    def __enter__(self) -> TracedBatch:
        self._started = time.time_ns()
        return self

    def taken(self, count: int) -> None:
        if count == 0:  # an empty receive: no span (an idle queue would fill the traces)
            return
        ids = self._step.receive_span(self._started, count).get_span_context()
        if ids.trace_flags.sampled:
            self._token = _BATCH.set(Link(ids, {names.LINK_KIND: "receive"}))

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _BATCH.reset(self._token)
            self._token = None
