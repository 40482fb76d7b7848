"""What a receiver actor of a traced endpoint sets up as it starts."""

from __future__ import annotations

from collections.abc import Mapping

from endpoint_runtime.metrics import RayMetrics
from endpoint_runtime.tracing.metrics import OpenTelemetryMetrics
from endpoint_runtime.tracing.setup import Telemetry, start_telemetry


def start_receiver_telemetry(
    endpoint: str, queue: str, ray_metrics: RayMetrics, *, receiver_id: str,
    environment: Mapping[str, str],
) -> Telemetry:
    """The SDK of this receiver process (service name = the endpoint's name, instance = the
    receiver); ``ray_metrics`` hands its flushes to OpenTelemetry instruments too."""
    telemetry = start_telemetry(endpoint, environment=environment, instance_id=receiver_id)
    ray_metrics.sinks.append(OpenTelemetryMetrics(telemetry.meter(), endpoint=endpoint,
                                                  queue=queue))
    return telemetry
