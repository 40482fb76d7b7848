"""What the actors of a traced endpoint set up as they start: each its SDK (service name =
the endpoint's name), its metrics fed to OpenTelemetry instruments beside Ray's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Observation

from endpoint_runtime.chain.tracing import attributes as names
from endpoint_runtime.chain.tracing.setup import Telemetry, start_telemetry
from endpoint_runtime.runtime.actors.otel_metrics import QUEUE, OpenTelemetryMetrics
from endpoint_runtime.runtime.actors.ray_metrics import RayMetrics


def start_receiver_telemetry(
    endpoint: str, queue: str, ray_metrics: RayMetrics, *, receiver_id: str,
    environment: Mapping[str, str],
) -> Telemetry:
    """The SDK of a receiver process (instance = the receiver's id); ``ray_metrics`` hands
    its flushes to OpenTelemetry instruments too."""
    telemetry = start_telemetry(endpoint, environment=environment, instance_id=receiver_id)
    ray_metrics.sinks.append(OpenTelemetryMetrics(telemetry.meter(), endpoint=endpoint,
                                                  queue=queue))
    return telemetry


def start_peeker_telemetry(
    endpoint: str, queue: str, ray_metrics: RayMetrics, *, environment: Mapping[str, str],
) -> Telemetry:
    """The SDK of a peeker process (instance ``<endpoint>-peeker``), with the gauge
    ``endpoint_runtime.queue.length``: the peeker's last estimate of the messages waiting
    (neither OpenTelemetry's conventions nor NServiceBus name one)."""
    telemetry = start_telemetry(endpoint, environment=environment,
                                instance_id=f"{endpoint}-peeker")
    attributes = {names.MESSAGING_SYSTEM: names.SYSTEM, QUEUE: queue,
                  names.DESTINATION: queue, names.CONSUMER_GROUP: endpoint}

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        length = ray_metrics.last_queue_length
        return () if length is None else (Observation(length, attributes),)

    telemetry.meter().create_observable_gauge(
        "endpoint_runtime.queue.length", callbacks=[observe], unit="{message}",
        description="messages waiting in the endpoint's queue (the peeker's estimate)")
    return telemetry
