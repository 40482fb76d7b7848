"""What a receiver actor of a traced endpoint sets up as it starts."""

from __future__ import annotations

from collections.abc import Mapping

from endpoint_runtime.metrics import Metrics
from endpoint_runtime.tracing.metrics import OpenTelemetryMetrics
from endpoint_runtime.tracing.setup import Telemetry, start_telemetry


def start_receiver_telemetry(
    endpoint: str, queue: str, ray_metrics: Metrics, *, receiver_id: str,
    environment: Mapping[str, str],
) -> tuple[Telemetry, Metrics]:
    """The SDK of this receiver process (service name = the endpoint's name, instance = the
    receiver), and the metrics its chain records: OpenTelemetry's beside ``ray_metrics``."""
    telemetry = start_telemetry(endpoint, environment=environment, instance_id=receiver_id)
    metrics = OpenTelemetryMetrics(telemetry.meter(), endpoint=endpoint, queue=queue,
                                   inner=ray_metrics)
    return telemetry, metrics
