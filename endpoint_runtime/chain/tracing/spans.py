"""Spans of outgoing messages and the trace context in message headers.

:class:`OutgoingSpans` is an outgoing hook (:mod:`endpoint_runtime.chain.outgoing`): for every
message a handler or a :class:`~endpoint_runtime.runtime.sender.Sender` sends, publishes or replies,
it makes a short producer span, a child of the current context (the attempt's span in a
handler, the caller's span outside), and writes that span's context into the headers with the
configured propagators (W3C ``traceparent``/``tracestate`` by default, the header NServiceBus
reads and writes). The receiving endpoint's ``tracing`` step continues from there. Under a
current span that was sampled out, no span is made (a parent-based sampler would drop it):
the message carries the current context, unsampled.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from endpoint_runtime.chain.tracing import attributes as names
from endpoint_runtime.wire.messages import Headers, MessageIntent

_OPERATIONS = {MessageIntent.SEND.value: "send", MessageIntent.PUBLISH.value: "publish",
               MessageIntent.REPLY.value: "reply"}


def tracer() -> trace.Tracer:
    """The runtime's tracer, from the process's tracer provider (a proxy until one is set)."""
    return trace.get_tracer(names.INSTRUMENTATION)


def header_attributes(
    headers: Mapping[str, str], copied: tuple[tuple[str, str], ...] = names.SENT_HEADERS,
) -> dict[str, Any]:
    """Messaging attributes of a message with these headers (``copied``: the headers kept
    under NServiceBus's names)."""
    found: dict[str, Any] = {names.MESSAGING_SYSTEM: names.SYSTEM}
    message_id = headers.get(Headers.MESSAGE_ID)
    if message_id is not None:
        found[names.MESSAGE_ID] = message_id
    conversation = headers.get(Headers.CONVERSATION_ID)
    if conversation is not None:
        found[names.CONVERSATION_ID] = conversation
    for header, attribute in copied:
        value = headers.get(header)
        if value is not None:
            found[attribute] = value
    return found


def incoming_parent(headers: Mapping[str, str]) -> tuple[Context, list[Link] | None]:
    """The context an attempt's span continues (from the message's trace headers), and its
    links: to the attempt before, when the message names one
    (``EndpointRuntime.ProcessingTraceParent``: a delayed retry, a retry from the error
    queue). With NServiceBus's ``StartNewTrace`` header set to ``True`` the span starts a new
    trace linked to the sender's span instead of continuing it."""
    extracted = propagate.extract(headers)
    links = None
    previous = headers.get(names.PROCESSING_TRACEPARENT)
    if previous is not None:
        attempt = _span_context(previous)
        if attempt.is_valid:
            links = [Link(attempt, {names.LINK_KIND: "previous_attempt"})]
    if headers.get(names.START_NEW_TRACE, "").lower() != "true":
        return extracted, links
    sender = trace.get_current_span(extracted).get_span_context()
    if sender.is_valid:
        links = [*(links or ()), Link(sender, {names.LINK_KIND: "sender"})]
    return Context(), links


_W3C = TraceContextTextMapPropagator()
_DEFAULT_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})
"""The headers of the default propagators (``OTEL_PROPAGATORS=tracecontext,baggage``)."""


class _Propagators:
    """Whether the global propagators are the default ones (checked once per object set)."""

    textmap: object = None
    default = False


_checked = _Propagators()


def inject(headers: MutableMapping[str, str], span: trace.Span) -> None:
    """``propagate.inject`` of ``span``'s context, written directly (1.6 against 3.5 us) when
    the propagators are the default W3C ones and no baggage is current: ``traceparent``, and
    ``tracestate`` when there is one, as the W3C propagator writes them."""
    textmap = propagate.get_global_textmap()
    if textmap is not _checked.textmap:
        _checked.textmap, _checked.default = textmap, textmap.fields == _DEFAULT_FIELDS
    ids = span.get_span_context()
    if not (_checked.default and ids.is_valid) or baggage.get_all():
        propagate.inject(headers, context=trace.set_span_in_context(span))
        return
    headers["traceparent"] = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"
    if ids.trace_state:
        headers["tracestate"] = ids.trace_state.to_header()


def record_failure(span: trace.Span, exc: BaseException) -> None:
    """``exc`` on ``span``: the exception event, ``error.type``, the status error."""
    kind = type(exc)
    span.record_exception(exc)
    span.set_attribute(names.ERROR_TYPE, f"{kind.__module__}.{kind.__qualname__}")
    span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {exc}"[:1000]))


def drops_unsampled_parents(tracer: trace.Tracer) -> bool:
    """Whether ``tracer``'s sampler drops every span whose remote parent was sampled out (the
    SDK's parent-based samplers as ``OTEL_TRACES_SAMPLER`` makes them): then such a message
    needs no sampling decision of the SDK."""
    sampler = getattr(tracer, "sampler", None)
    if sampler is None:  # no SDK (or a proxy): always ask the tracer
        return False
    description = str(sampler.get_description())
    return (description.startswith("ParentBased{")
            and "remoteParentNotSampled:AlwaysOffSampler" in description)


def _span_context(traceparent: str) -> trace.SpanContext:
    return trace.get_current_span(_W3C.extract({"traceparent": traceparent})).get_span_context()


class OutgoingSpans:
    """The outgoing hook: a producer span per message, its context in the headers.

    Example::

        sender.on_outgoing(OutgoingSpans(tracer(), "web"))   # what Sender(tracing=True) does
    """

    wants_destination = True
    """Called ``hook(headers, destination)`` (see
    :func:`endpoint_runtime.chain.outgoing.create_outgoing`)."""

    __slots__ = ("_endpoint", "_tracer")

    def __init__(self, tracer: trace.Tracer, endpoint: str) -> None:
        self._tracer = tracer
        self._endpoint = endpoint

    @classmethod
    def for_sender(cls, name: str) -> OutgoingSpans:
        return cls(tracer(), name)

    def __call__(self, headers: MutableMapping[str, str], destination: str | None = None) -> None:
        current = trace.get_current_span()
        if not current.is_recording() and current.get_span_context().is_valid:
            # Sampled out: under the (default) parent-based samplers no child of it would be
            # sampled either, so no span is made; the message carries the current context.
            inject(headers, current)
            return
        operation = _OPERATIONS.get(headers.get(Headers.MESSAGE_INTENT, ""), "send")
        types = headers.get(Headers.ENCLOSED_MESSAGE_TYPES, "")
        published = destination is None
        if destination is None:  # a publish goes to every subscriber: named by its event type
            destination = types.split(";", 1)[0]
        span = self._tracer.start_span(f"{operation} {destination}", kind=SpanKind.PRODUCER)
        if span.is_recording():  # attributes only for a sampled span: they cost the most
            attributes = header_attributes(headers)
            attributes[names.OPERATION_TYPE] = "send"
            attributes[names.OPERATION_NAME] = operation
            attributes[names.DESTINATION] = destination
            if published:
                attributes[names.EVENT_TYPES] = types
            span.set_attributes(attributes)
        inject(headers, span)
        span.end()
