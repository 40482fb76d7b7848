"""The runtime's OTLP span encoding against the SDK's: what it writes, decoded with
OpenTelemetry's protobuf classes, equals the SDK's encoding of the same spans."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import (
    encode_spans as sdk_encode_spans,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from endpoint_runtime.chain.tracing import otlp
from endpoint_runtime.chain.tracing.otlp import SpanEncoder, encode_spans
from endpoint_runtime.chain.tracing.setup import exporter_classes

REMOTE = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                     trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "a=1")]))


def spans_of(provider: TracerProvider, exporter: InMemorySpanExporter) -> Sequence[ReadableSpan]:
    """Spans of every shape the runtime makes, and values of every attribute type."""
    tracer = provider.get_tracer("endpoint_runtime", "1.2", attributes={"scope.kind": "test"})
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER) as root:
        root.set_attributes({"text": "é and 🙂", "empty": "", "yes": True, "no": False,
                             "zero": 0, "negative": -7, "big": 2**62, "ratio": 0.25,
                             "texts": ("a", "b"), "numbers": (1, 2, 3), "flags": (True,)})
        tracer.start_span("child", kind=SpanKind.PRODUCER).end()
    failed = tracer.start_span("process public.sales", kind=SpanKind.CONSUMER,
                               context=set_span_in_context(NonRecordingSpan(REMOTE)),
                               links=[Link(REMOTE, {"endpoint_runtime.link": "receive"}),
                                      Link(root.get_span_context())])
    failed.record_exception(ValueError("no such customer"))
    failed.set_status(Status(StatusCode.ERROR, "ValueError: no such customer"))
    failed.end()
    ok = tracer.start_span("receive public.sales", kind=SpanKind.CLIENT,
                           attributes={"messaging.batch.message_count": 50})
    ok.add_event("plain")
    ok.set_status(Status(StatusCode.OK))
    ok.end()
    return exporter.get_finished_spans()


@pytest.fixture
def spans() -> Iterator[Sequence[ReadableSpan]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sales",
                                                        "process.pid": 42}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield spans_of(provider, exporter)
    provider.shutdown()


def decoded(body: bytes) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(body)


def test_the_encoding_decodes_to_what_the_sdk_encodes(spans: Sequence[ReadableSpan]) -> None:
    assert decoded(encode_spans(spans)) == sdk_encode_spans(spans)


def test_a_second_batch_from_the_cache_is_the_same(spans: Sequence[ReadableSpan]) -> None:
    encoder = SpanEncoder()
    first = encoder.encode(spans)
    assert encoder.encode(spans) == first
    assert decoded(encoder.encode(spans[1:])) == sdk_encode_spans(spans[1:])


def test_spans_of_two_resources_are_kept_apart(spans: Sequence[ReadableSpan]) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "billing"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    both = [*spans, *spans_of(provider, exporter)]
    assert len(decoded(encode_spans(both)).resource_spans) == 2
    assert decoded(encode_spans(both)) == sdk_encode_spans(both)


def test_the_comparison_sees_a_wrong_flag(spans: Sequence[ReadableSpan],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above catches a fault of the encoder: a link's remoteness lost."""
    monkeypatch.setattr(otlp, "_IS_REMOTE", 0)
    assert decoded(encode_spans(spans)) != sdk_encode_spans(spans)


def test_otlp_over_http_exports_with_this_encoding() -> None:
    assert exporter_classes("TRACES") == [otlp.SpanExporter]
