"""The receivers' OTLP span exporter is OpenTelemetry's own (the runtime's encoder of its own
was removed: its CPU saving per span did not show end to end, docs/performance.md)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from endpoint_runtime.chain.tracing.setup import exporter_classes


def test_otlp_over_http_exports_with_the_sdk_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    assert exporter_classes("TRACES") == [OTLPSpanExporter]
