"""An OTLP/HTTP receiver for tests: what every process's exporter sent, decoded.

The receivers of a traced deployment export their spans and metrics with the SDK's OTLP/HTTP
exporters (protobuf) to ``OTEL_EXPORTER_OTLP_ENDPOINT``; a test points that at
:class:`OtlpReceiver`, which serves ``/v1/traces`` and ``/v1/metrics`` on 127.0.0.1 in a
thread and keeps what arrives as plain :class:`ReceivedSpan` values and metric names.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from benchmarks.otlp_sink import Drop


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]] = field(default_factory=list)
    """(trace id, span id) of each link."""
    resource: dict[str, Any] = field(default_factory=dict)
    """The attributes of the exporting process's resource."""


@dataclass
class Received:
    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: dict[str, set[str]] = field(default_factory=dict)
    """Metric names per service."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                found.extend(_span(resource, span) for span in scope_spans.spans)
        with self.lock:
            self.spans.extend(found)

    def take_metrics(self, body: bytes) -> None:
        request = ExportMetricsServiceRequest.FromString(body)
        with self.lock:
            for resource_metrics in request.resource_metrics:
                resource = {a.key: _value(a.value)
                            for a in resource_metrics.resource.attributes}
                names = self.metrics.setdefault(str(resource.get("service.name")), set())
                for scope_metrics in resource_metrics.scope_metrics:
                    names.update(metric.name for metric in scope_metrics.metrics)

    def snapshot(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)


def _span(resource: dict[str, Any], span: Span) -> ReceivedSpan:
    return ReceivedSpan(
        service=str(resource.get("service.name")), name=span.name,
        kind=Span.SpanKind.Name(span.kind),
        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        attributes={a.key: _value(a.value) for a in span.attributes},
        error=span.status.code == Status.STATUS_CODE_ERROR,
        events=[(e.name, {a.key: _value(a.value) for a in e.attributes})
                for e in span.events],
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        resource=resource,
    )


class OtlpReceiver:
    """Serves OTLP/HTTP on 127.0.0.1 at a free port while in its ``with`` block."""

    def __init__(self) -> None:
        self.received = Received()
        received = self.received

        class Handler(Drop):  # the benchmark's sink, keeping what it is sent
            def do_POST(self) -> None:
                body = self.read_body()
                if self.path == "/v1/traces":
                    received.take_traces(body)
                elif self.path == "/v1/metrics":
                    received.take_metrics(body)
                self.acknowledge()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def spans_of_trace(spans: list[ReceivedSpan], trace_id: str) -> Iterator[ReceivedSpan]:
    return (span for span in spans if span.trace_id == trace_id)
