"""Spans of the delayed-message mover: one per dispatch of a due message.

The mover (``endpoint_runtime.delayed.mover``, in a traced endpoint's peeker) calls
:class:`DeliverySpans` after each attempt to dispatch a due message: a producer span
``deliver <destination>`` from the attempt's start to its end, continuing the trace of the
message's ``traceparent`` (a child of the span that sent the deferred message, or of the
delayed retry's sender), **linked** to the attempt before when the message names one (a
delayed retry's ``EndpointRuntime.ProcessingTraceParent``). The message's headers are not
rewritten: the attempt that processes it stays a child of the span that sent it, a sibling of
this one. A failed dispatch records its exception; ``nservicebus.recoverability_action`` says
``error_queue`` when it was the last.
"""

from __future__ import annotations

import msgspec
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from endpoint_runtime.chain.tracing import attributes as names
from endpoint_runtime.chain.tracing.spans import (
    header_attributes,
    incoming_parent,
    record_failure,
    tracer,
)
from endpoint_runtime.delayed.store import DelayedMessage


class DeliverySpans:
    """The mover's ``on_dispatched`` observer (see the module docstring)."""

    def __init__(self, endpoint: str, tracer_: trace.Tracer | None = None) -> None:
        self.endpoint = endpoint
        self.tracer = tracer_ or tracer()

    def __call__(self, message: DelayedMessage, started: int, error: Exception | None,
                 outcome: str) -> None:
        headers = _headers(message.headers)
        parent, links = incoming_parent(headers) if headers else (Context(), None)
        span = self.tracer.start_span(f"deliver {message.destination}", context=parent,
                                      kind=SpanKind.PRODUCER, links=links, start_time=started)
        if span.is_recording():
            attributes = header_attributes(headers)
            attributes.update({
                names.OPERATION_TYPE: "send", names.OPERATION_NAME: "deliver",
                names.DESTINATION: message.destination,
                names.DELAYED_DISPATCH_FAILURES: message.failures})
            if outcome == "error_queue":
                attributes[names.RECOVERABILITY_ACTION] = "error_queue"
            span.set_attributes(attributes)
            if error is not None:
                record_failure(span, error)
        span.end()


def _headers(text: str) -> dict[str, str]:
    """The text headers of a stored message (none when they do not parse: a root span)."""
    try:
        decoded = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {key: value for key, value in decoded.items() if isinstance(value, str)}
