"""The processing metrics as OpenTelemetry instruments, beside Ray's.

With ``tracing=True`` a receiver records each of its processing metrics twice: in Ray's
metrics (:mod:`endpoint_runtime.metrics`, their documented names unchanged) and in these
instruments of the ``endpoint_runtime`` meter, exported by the receiver's meter provider
(:mod:`.setup`). Names follow NServiceBus (``nservicebus.messaging.*``,
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

Attributes: ``nservicebus.queue`` and ``messaging.destination.name`` (the endpoint's queue),
``messaging.consumer.group.name`` (the endpoint), ``messaging.system``, and
``nservicebus.message_type`` (a registered type's wire name or ``unknown``: header text from
outside never becomes an attribute value). The queue length stays a Ray metric (the peeker's
estimate).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

from endpoint_runtime.messages import Headers
from endpoint_runtime.metrics import Metrics, critical_seconds
from endpoint_runtime.tracing import attributes as names

MESSAGE_TYPE = "nservicebus.message_type"
QUEUE = "nservicebus.queue"


class OpenTelemetryMetrics(Metrics):
    """Records in OpenTelemetry instruments and passes every call on to ``inner``."""

    def __init__(self, meter: metrics.Meter, *, endpoint: str, queue: str,
                 inner: Metrics) -> None:
        self.inner = inner
        self._common: dict[str, Any] = {
            names.MESSAGING_SYSTEM: names.SYSTEM, QUEUE: queue, names.DESTINATION: queue,
            names.CONSUMER_GROUP: endpoint}
        self._by_type: dict[str, dict[str, Any]] = {}
        message = "{message}"
        self._successes = meter.create_counter(
            "nservicebus.messaging.successes", unit=message,
            description="messages processed successfully (their work committed)")
        self._consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit=message,
            description="messages processed successfully (their work committed)")
        self._failures = meter.create_counter(
            "nservicebus.messaging.failures", unit=message, description="failed attempts")
        self._immediate = meter.create_counter(
            "nservicebus.recoverability.immediate", unit=message,
            description="immediate retries requested")
        self._delayed = meter.create_counter(
            "nservicebus.recoverability.delayed", unit=message,
            description="delayed retries requested")
        self._error = meter.create_counter(
            "nservicebus.recoverability.error", unit=message,
            description="messages moved to the error queue")
        self._handler_time = meter.create_histogram(
            "nservicebus.messaging.handler_time", unit="s",
            description="time in the handlers of a message processed successfully")
        self._process_duration = meter.create_histogram(
            "messaging.process.duration", unit="s",
            description="time in the handlers of a message processed successfully")
        self._critical_time = meter.create_histogram(
            "nservicebus.messaging.critical_time", unit="s",
            description="time from TimeSent to the end of processing")

    def _attributes(self, message_type: str) -> dict[str, Any]:
        found = self._by_type.get(message_type)
        if found is None:  # registered types and "unknown": a bounded set
            found = self._by_type[message_type] = {**self._common, MESSAGE_TYPE: message_type}
        return found

    def processed(self, message_type: str, started: float, ended: float,
                  headers: dict[str, str]) -> None:
        self.inner.processed(message_type, started, ended, headers)
        attributes = self._attributes(message_type)
        self._successes.add(1, attributes)
        self._consumed.add(1, attributes)
        self._handler_time.record(ended - started, attributes)
        self._process_duration.record(ended - started, attributes)
        critical = critical_seconds(headers.get(Headers.TIME_SENT), ended)
        if critical is not None:
            self._critical_time.record(critical, attributes)

    def failed(self, message_type: str, *, immediate_retry: bool) -> None:
        self.inner.failed(message_type, immediate_retry=immediate_retry)
        attributes = self._attributes(message_type)
        self._failures.add(1, attributes)
        if immediate_retry:
            self._immediate.add(1, attributes)

    def delayed_retry(self, message_type: str) -> None:
        self.inner.delayed_retry(message_type)
        self._delayed.add(1, self._attributes(message_type))

    def moved_to_error(self, message_type: str) -> None:
        self.inner.moved_to_error(message_type)
        self._error.add(1, self._attributes(message_type))

    def publish_undeliverable(self, message_type: str) -> None:
        self.inner.publish_undeliverable(message_type)

    def queue_length(self, length: int) -> None:
        self.inner.queue_length(length)

    async def close(self) -> None:
        await self.inner.close()
