"""The OpenTelemetry SDK in one receiver process, configured by the ``OTEL_*`` variables.

A receiver of an endpoint with ``tracing=True`` calls :func:`start_telemetry` as it starts and
:meth:`Telemetry.shutdown` as it stops (the batch processor's spans and the last metrics are
exported then). Every receiver process sets up its own exporter, on whatever node Ray placed
it; the deployment hands the receivers the ``OTEL_*`` variables of the process that deployed
it, which win over the node's own.

What the variables choose (the SDK's own names; the defaults in brackets):

- ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: ``otlp`` [default], ``console`` or
  ``none``; ``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf`` [default] or ``grpc`` (needs
  ``opentelemetry-exporter-otlp-proto-grpc``); ``OTEL_EXPORTER_OTLP_ENDPOINT``
  [``http://localhost:4318``], ``OTEL_EXPORTER_OTLP_HEADERS`` and the per-signal variants.
- ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` [``parentbased_always_on``],
  ``OTEL_BSP_*`` (the batch span processor), ``OTEL_METRIC_EXPORT_INTERVAL`` [60000 ms].
- ``OTEL_RESOURCE_ATTRIBUTES``; ``service.name`` is always the endpoint's name,
  ``service.instance.id`` the receiver's id, ``process.pid`` the actor's process.
  ``OTEL_SDK_DISABLED=true``: no SDK at all.

When the endpoint's own code installed a tracer provider already, it is kept (and the
runtime's spans go through it); the meter provider is the runtime's own.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Mapping
from typing import Any

import structlog
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from endpoint_runtime.chain.tracing import attributes as names
from endpoint_runtime.errors import ConfigurationError

log = structlog.get_logger("endpoint_runtime.chain.tracing")

SHUTDOWN_SECONDS = 5.0
"""How long an actor's stop waits for its last spans and metrics to be exported."""

class Telemetry:
    """The SDK's providers of one process; :meth:`shutdown` exports what is left."""

    def __init__(self, tracer_provider: TracerProvider | None,
                 meter_provider: MeterProvider | None) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider

    def meter(self) -> metrics.Meter:
        provider = self.meter_provider or metrics.NoOpMeterProvider()
        return provider.get_meter(names.INSTRUMENTATION)

    def shutdown(self) -> None:
        """Flush and stop (blocking: :meth:`close` runs it off the event loop)."""
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()

    async def close(self, timeout: float = SHUTDOWN_SECONDS) -> None:  # noqa: ASYNC109
        """:meth:`shutdown` in a thread, waited for ``timeout`` s at most: a collector that
        does not answer must not hold up an actor's stop (what is left is lost)."""
        try:
            await asyncio.wait_for(asyncio.to_thread(self.shutdown), timeout)
        except TimeoutError:
            log.warning("telemetry_flush_timeout", timeout_s=timeout)


def start_telemetry(
    service_name: str, *, environment: Mapping[str, str] | None = None,
    instance_id: str | None = None,
) -> Telemetry:
    """Set up tracing and metrics in this process (see the module docstring)."""
    os.environ.update(environment or {})
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Telemetry(None, None)
    attributes: dict[str, Any] = {"service.name": service_name, "process.pid": os.getpid()}
    if instance_id:
        attributes["service.instance.id"] = instance_id
    resource = Resource.create(attributes)
    tracer_provider: TracerProvider | None = None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        tracer_provider = TracerProvider(resource=resource)  # sampler: OTEL_TRACES_SAMPLER
        for exporter in _exporters("TRACES"):
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
    else:
        log.info("tracer_provider_kept", reason="set by the endpoint's code")
    readers = [PeriodicExportingMetricReader(exporter) for exporter in _exporters("METRICS")]
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return Telemetry(tracer_provider, meter_provider)


_EXPORTERS: dict[str, tuple[type[Any], str, str]] = {
    "TRACES": (ConsoleSpanExporter, "opentelemetry.exporter.otlp.proto.{}.trace_exporter",
               "OTLPSpanExporter"),
    "METRICS": (ConsoleMetricExporter, "opentelemetry.exporter.otlp.proto.{}.metric_exporter",
                "OTLPMetricExporter"),
}
"""Per signal: the console exporter, the OTLP exporter's module (``http`` or ``grpc``) and
class."""


def exporter_classes(signal: str) -> list[type[Any]]:
    """The exporter classes ``OTEL_<signal>_EXPORTER`` (default ``otlp``) and the OTLP
    protocol name, imported; :class:`ConfigurationError` for what this runtime cannot make.
    A deployment checks them where it starts (:func:`endpoint_runtime.chain.tracing.check`)."""
    console, module, name = _EXPORTERS[signal]
    chosen = os.environ.get(f"OTEL_{signal}_EXPORTER", "otlp")
    classes: list[type[Any]] = []
    for kind in (part.strip().lower() for part in chosen.split(",") if part.strip()):
        if kind == "console":
            classes.append(console)
        elif kind == "otlp":
            protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
                        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                        or "http/protobuf").strip()
            if protocol not in ("http/protobuf", "grpc"):
                raise ConfigurationError(
                    f"OTLP protocol {protocol!r}: this runtime exports http/protobuf or grpc")
            package = "grpc" if protocol == "grpc" else "http"
            try:
                classes.append(getattr(importlib.import_module(module.format(package)), name))
            except ImportError as exc:
                raise ConfigurationError(
                    f"OTLP over {protocol} needs opentelemetry-exporter-otlp-proto-{package} "
                    "(pip install 'endpoint-runtime[otel]' brings the http one)") from exc
        elif kind != "none":
            raise ConfigurationError(
                f"OTEL_{signal}_EXPORTER={kind!r}: this runtime knows otlp, console and none")
    return classes


def _exporters(signal: str) -> list[Any]:
    return [exporter() for exporter in exporter_classes(signal)]
