"""The tracing step and the outgoing spans without a database or Ray: spans made by a real
SDK into an in-memory exporter of the test's own (the step takes the tracer it is given)."""

from __future__ import annotations

import importlib.util
import pickle
import re
import subprocess
import sys
import uuid
from typing import Any

import msgspec
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.pipeline import BUILT_IN, Outcome, Pipeline, Unit
from endpoint_runtime.chain.tracing.spans import OutgoingSpans
from endpoint_runtime.chain.tracing.step import TracingStep
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.redaction import OtelEnvironment
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import TransportMessage, encode_headers
from tests.unit.test_pipeline import Recording

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Order(msgspec.Struct):
    order_id: str


def traced_pipeline(provider: TracerProvider, handler: Any) -> Pipeline:
    endpoint = Endpoint("sales", tracing=True, immediate_retries=1, audit_queue="audit")
    endpoint.register(handler, Order)
    pipeline = endpoint.create_pipeline()
    step: TracingStep = pipeline.step("tracing")
    step.use(provider.get_tracer("test"))
    return pipeline


def received(extra: dict[str, str] | None = None) -> TransportMessage:
    outgoing = create_outgoing(Order(order_id="1"), originating_endpoint="web",
                               headers=extra)
    return TransportMessage(native_id=uuid.uuid4(), seq=1, headers=dict(outgoing.headers),
                            raw_headers=encode_headers(dict(outgoing.headers)),
                            body=outgoing.body)


async def one_accepted_span(
    exported: tuple[TracerProvider, InMemorySpanExporter],
    message: TransportMessage | dict[str, str],
) -> ReadableSpan:
    """The one span of a message (or of one with these extra headers) a handler accepts."""
    provider, exporter = exported

    async def accept(message: Order, context: HandlerContext) -> None:
        return None

    if isinstance(message, dict):
        message = received(message)
    await traced_pipeline(provider, accept).run(message, Unit(None, Recording(), None))
    [span] = exporter.get_finished_spans()
    return span


async def forward_to_billing(
    provider: TracerProvider, message: TransportMessage,
) -> tuple[Outcome, dict[str, Any], Recording]:
    """Run ``message`` through a traced chain whose handler sends it on to billing: the
    outcome, the handler's log context and what was dispatched."""
    seen: dict[str, Any] = {}

    async def forward(message: Order, context: HandlerContext) -> None:
        seen.update(structlog.contextvars.get_contextvars())
        await context.send(Order(order_id=message.order_id), "billing")

    dispatcher = Recording()
    outcome = await traced_pipeline(provider, forward).run(message, Unit(None, dispatcher, None))
    return outcome, seen, dispatcher


def by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in spans if span.kind is kind]


def test_tracing_off_leaves_the_step_out_and_opentelemetry_unimported() -> None:
    assert "tracing" not in Endpoint("sales").create_pipeline().steps
    script = ("import sys; from endpoint_runtime import Endpoint; "
              "Endpoint('sales').create_pipeline(); "
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_tracing_on_puts_the_step_right_after_the_log_context() -> None:
    steps = list(Endpoint("sales", tracing=True).create_pipeline().steps)
    assert steps[:3] == ["log_context", "tracing", "recoverability"]
    assert BUILT_IN.index("tracing") == 1


async def test_an_attempt_continues_the_incoming_trace_and_its_sends_continue_it(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = exported
    message = received({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    outcome, seen, dispatcher = await forward_to_billing(provider, message)

    assert outcome is Outcome.HANDLED
    spans = exporter.get_finished_spans()
    [process] = by_kind(spans, SpanKind.CONSUMER)
    [send] = by_kind(spans, SpanKind.PRODUCER)
    assert format_trace_id(process.context.trace_id) == TRACE_ID
    assert process.parent is not None
    assert format_span_id(process.parent.span_id) == PARENT_ID
    assert process.name == "process public.sales"
    assert process.attributes is not None
    assert process.attributes["messaging.message.id"] == message.message_id
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["nservicebus.originating_endpoint"] == "web"
    assert send.parent is not None
    assert send.parent.span_id == process.context.span_id
    assert send.name == "send public.billing"
    assert send.attributes is not None
    assert send.attributes["messaging.destination.name"] == "public.billing"
    # The log context of the handler names the attempt's span.
    assert seen["trace_id"] == TRACE_ID
    assert seen["span_id"] == format_span_id(process.context.span_id)
    # The message sent carries the send span's context; the audit copy the attempt's.
    [(_, billing), (_, audit)] = dispatcher.sent
    assert billing.headers["traceparent"] == (
        f"00-{TRACE_ID}-{format_span_id(send.context.span_id)}-01")
    assert audit.headers["EndpointRuntime.ProcessingTraceParent"] == (
        f"00-{TRACE_ID}-{format_span_id(process.context.span_id)}-01")
    assert audit.headers["traceparent"] == f"00-{TRACE_ID}-{PARENT_ID}-01"


async def test_a_failed_attempt_records_its_exception_and_the_next_step(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = exported

    async def refuse(message: Order, context: HandlerContext) -> None:
        raise ValueError("no such customer")

    outcome = await traced_pipeline(provider, refuse).run(received(),
                                                          Unit(None, Recording(), None))

    assert outcome is Outcome.FAILED
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["nservicebus.recoverability_action"] == "immediate_retry"
    assert span.attributes["error.type"] == "builtins.ValueError"
    [event] = span.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "no such customer"


async def test_start_new_trace_makes_a_root_linked_to_the_sender(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    span = await one_accepted_span(exported, {
        "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
        "NServiceBus.OpenTelemetry.StartNewTrace": "True"})
    assert span.parent is None
    assert format_trace_id(span.context.trace_id) != TRACE_ID
    [link] = span.links
    assert format_trace_id(link.context.trace_id) == TRACE_ID
    assert format_span_id(link.context.span_id) == PARENT_ID
    assert link.attributes == {"endpoint_runtime.link": "sender"}


async def test_a_message_naming_an_earlier_attempt_links_to_it(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    earlier = "1" * 16
    message = received({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
                        "EndpointRuntime.ProcessingTraceParent": f"00-{TRACE_ID}-{earlier}-01"})
    span = await one_accepted_span(exported, message)
    assert span.parent is not None
    assert format_span_id(span.parent.span_id) == PARENT_ID
    [link] = span.links
    assert format_span_id(link.context.span_id) == earlier
    assert link.attributes == {"endpoint_runtime.link": "previous_attempt"}
    # ... and the message now names this attempt, for the copies made of it.
    assert message.headers["EndpointRuntime.ProcessingTraceParent"] == (
        f"00-{TRACE_ID}-{format_span_id(span.context.span_id)}-01")


def test_the_environment_switches_tracing_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_TRACING", "true")
    assert Endpoint("sales").settings.tracing
    assert "tracing" in Endpoint("sales").create_pipeline().steps


def test_a_missing_sdk_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from endpoint_runtime.chain import tracing

    tracing.check()  # installed here ([dev] brings [otel])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "opentelemetry.sdk" else real(name, *a))
    with pytest.raises(ConfigurationError, match=r"endpoint-runtime\[otel\]"):
        tracing.check()


def test_a_send_outside_handlers_is_a_child_of_the_callers_span(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = exported
    tracer = provider.get_tracer("web")
    hook = OutgoingSpans(tracer, "web")
    with tracer.start_as_current_span("POST /orders") as request:
        outgoing = create_outgoing(Order(order_id="1"), hooks=[hook],
                                   destination=QueueAddress("sales"))
    send = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER)
    assert send.parent is not None
    assert send.parent.span_id == request.get_span_context().span_id
    assert send.name == "send public.sales"
    ids = send.context
    assert outgoing.headers["traceparent"] == (
        f"00-{format_trace_id(ids.trace_id)}-{format_span_id(ids.span_id)}-{ids.trace_flags:02x}")
    assert ids.trace_flags.sampled


def test_under_a_sampled_out_span_no_send_span_is_made_and_the_context_goes_on() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("web")
    with tracer.start_as_current_span("POST /orders") as request:
        outgoing = create_outgoing(Order(order_id="1"), hooks=[OutgoingSpans(tracer, "web")],
                                   destination=QueueAddress("sales"))
    assert exporter.get_finished_spans() == ()
    ids = request.get_span_context()
    assert not ids.trace_flags.sampled
    assert outgoing.headers["traceparent"] == (
        f"00-{format_trace_id(ids.trace_id)}-{format_span_id(ids.span_id)}-{ids.trace_flags:02x}")


@pytest.mark.parametrize(("sampler", "recorded"), [
    (ParentBased(ALWAYS_ON), False),  # drops it: the step asks no sampler
    (ALWAYS_ON, True),  # ignores the parent's flag: the step must ask it
])
async def test_a_message_whose_sender_was_sampled_out(sampler: Sampler, recorded: bool) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    message = received({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"})
    _, seen, dispatcher = await forward_to_billing(provider, message)

    spans = exporter.get_finished_spans()
    assert bool(spans) is recorded
    assert seen["trace_id"] == TRACE_ID
    [(_, billing), _] = dispatcher.sent
    _, trace_id, span_id, flags = billing.headers["traceparent"].split("-")
    assert trace_id == TRACE_ID
    if not recorded:  # the sender's context went on, unsampled
        assert (seen["span_id"], span_id, flags) == (PARENT_ID, PARENT_ID, "00")


def test_otlp_headers_handed_to_the_actors_stay_out_of_reprs() -> None:
    secret = "Authorization=Bearer s3cr3t-token"
    environment = OtelEnvironment.of({"OTEL_EXPORTER_OTLP_HEADERS": secret,
                                      "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                                      "HOME": "/root"})
    config = DeploymentConfig(endpoint_path="m:e", endpoint_name="sales",
                              address=QueueAddress("sales"), dsn="postgresql:///db",
                              settings=EndpointSettings(tracing=True),
                              otel_environment=environment)
    assert "s3cr3t" not in repr(config)
    assert "http://collector:4318" in repr(config)
    copied = pickle.loads(pickle.dumps(config)).otel_environment
    assert copied == {"OTEL_EXPORTER_OTLP_HEADERS": secret,
                      "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert "s3cr3t" not in repr(copied)


@pytest.mark.parametrize(("variable", "value", "named"), [
    ("OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER='zipkin'"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTLP protocol 'http/json'"),
])
def test_an_exporter_this_runtime_cannot_make_is_named_where_it_deploys(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str,
) -> None:
    from endpoint_runtime.chain import tracing

    tracing.check()
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        tracing.check()


@pytest.mark.parametrize("state", [None, "vendor=a1,other=b2"])
@pytest.mark.parametrize("flags", [0, 1])
def test_the_direct_w3c_writer_writes_what_the_propagators_write(
    state: str | None, flags: int,
) -> None:
    from opentelemetry import baggage, propagate, trace
    from opentelemetry.context import attach, detach
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    from endpoint_runtime.chain.tracing.spans import inject

    span = NonRecordingSpan(SpanContext(
        int(TRACE_ID, 16), int(PARENT_ID, 16), is_remote=False, trace_flags=TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else None))
    ours: dict[str, str] = {}
    inject(ours, span)
    theirs: dict[str, str] = {}
    propagate.inject(theirs, context=trace.set_span_in_context(span))
    assert ours == theirs
    assert ours["traceparent"] == f"00-{TRACE_ID}-{PARENT_ID}-0{flags}"
    # Baggage current, or other propagators: the propagators write it all.
    token = attach(baggage.set_baggage("tenant", "acme"))
    try:
        with_baggage: dict[str, str] = {}
        inject(with_baggage, span)
    finally:
        detach(token)
    assert with_baggage == {**theirs, "baggage": "tenant=acme"}
    default = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextOnly())
    try:
        only: dict[str, str] = {}
        inject(only, span)
    finally:
        propagate.set_global_textmap(default)
    assert only == {"traceparent": "written by the other propagator"}


class TraceContextOnly:
    """A propagator of other fields: what it writes must be what the headers get."""

    fields = frozenset({"traceparent"})

    def inject(self, carrier: dict[str, str], context: Any = None, setter: Any = None) -> None:
        carrier["traceparent"] = "written by the other propagator"

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context
