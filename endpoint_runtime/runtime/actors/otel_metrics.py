"""The processing metrics as OpenTelemetry instruments, beside Ray's.

With ``tracing=True`` a receiver's metrics (:class:`endpoint_runtime.chain.metrics.RayMetrics`,
their Ray names unchanged) hand each second's sums and samples to these instruments of the
``endpoint_runtime`` meter as well, exported by the receiver's meter provider (:mod:`.setup`):
nothing more is done per message. Names follow NServiceBus (``nservicebus.messaging.*``,
``nservicebus.recoverability.*``) and OpenTelemetry's messaging metric conventions
(``messaging.*``):

======================================  =========  =========================================
instrument                              kind       what
======================================  =========  =========================================
nservicebus.messaging.successes         counter    messages whose work committed
messaging.client.consumed.messages      counter    the same, by the messaging conventions
nservicebus.messaging.failures          counter    failed attempts
nservicebus.recoverability.immediate    counter    immediate retries
nservicebus.recoverability.delayed      counter    delayed retries scheduled
nservicebus.recoverability.error        counter    messages moved to the error queue
nservicebus.messaging.handler_time      histogram  seconds in the handlers (successes)
messaging.process.duration              histogram  the same, by the messaging conventions
nservicebus.messaging.critical_time     histogram  seconds from TimeSent to the end of
                                                   processing (successes)
======================================  =========  =========================================

Counters are exact; histograms take the samples Ray's do (the first ``HISTOGRAM_SAMPLES`` of
each second and type). Attributes: ``nservicebus.queue`` and ``messaging.destination.name``
(the endpoint's queue), ``messaging.consumer.group.name`` (the endpoint),
``messaging.system``, ``nservicebus.message_type`` (a registered type's wire name or
``unknown``: header text from outside never becomes an attribute value). The queue length
is the peeker's (:func:`.processes.start_peeker_telemetry`).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

from endpoint_runtime.chain.tracing import attributes as names
from endpoint_runtime.runtime.actors.ray_metrics import Counts, Timings, critical_seconds

MESSAGE_TYPE = "nservicebus.message_type"
QUEUE = "nservicebus.queue"
_MESSAGE = "{message}"
_COUNTERS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("messages_processed", ""): (
        ("nservicebus.messaging.successes", "messages processed successfully"),
        ("messaging.client.consumed.messages", "messages processed successfully")),
    ("messages_failed", ""): (("nservicebus.messaging.failures", "failed attempts"),),
    ("retries", "immediate"): (
        ("nservicebus.recoverability.immediate", "immediate retries requested"),),
    ("retries", "delayed"): (
        ("nservicebus.recoverability.delayed", "delayed retries requested"),),
    ("moved_to_error", ""): (
        ("nservicebus.recoverability.error", "messages moved to the error queue"),),
}
"""Ray's counter (and kind) -> the OpenTelemetry counters it feeds."""


class OpenTelemetryMetrics:
    """A sink of :class:`~endpoint_runtime.chain.metrics.RayMetrics`: each flush's sums and samples
    recorded in OpenTelemetry instruments."""

    def __init__(self, meter: metrics.Meter, *, endpoint: str, queue: str) -> None:
        self._common: dict[str, Any] = {
            names.MESSAGING_SYSTEM: names.SYSTEM, QUEUE: queue, names.DESTINATION: queue,
            names.CONSUMER_GROUP: endpoint}
        self._counters = {
            source: [meter.create_counter(name, unit=_MESSAGE, description=description)
                     for name, description in targets]
            for source, targets in _COUNTERS.items()}
        self._handler_time = [
            meter.create_histogram(name, unit="s", description=description)
            for name, description in (
                ("nservicebus.messaging.handler_time", "time in the handlers (successes)"),
                ("messaging.process.duration", "time in the handlers (successes)"))]
        self._critical_time = meter.create_histogram(
            "nservicebus.messaging.critical_time", unit="s",
            description="time from TimeSent to the end of processing (successes)")

    def _attributes(self, message_type: str) -> dict[str, Any]:
        return {**self._common, MESSAGE_TYPE: message_type}

    def __call__(self, counts: Counts, timings: Timings) -> None:
        for (counter, message_type, kind), n in counts.items():
            for instrument in self._counters.get((counter, kind), ()):
                instrument.add(n, self._attributes(message_type))
        for message_type, observed in timings.items():
            attributes = self._attributes(message_type)
            for started, ended, sent in observed:
                for histogram in self._handler_time:
                    histogram.record(ended - started, attributes)
                critical = critical_seconds(sent, ended)
                if critical is not None:
                    self._critical_time.record(critical, attributes)
