"""Spans made by a real OpenTelemetry SDK into an in-memory exporter of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@contextmanager
def in_memory() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A provider whose spans end up, synchronously, in the exporter; shut down after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        yield provider, exporter
    finally:
        provider.shutdown()
