"""Live metrics of endpoints, exported through Ray's metrics API (in the actors: the chain
reports through :class:`~endpoint_runtime.chain.metrics.Metrics` and imports no Ray).

Ray serves them for Prometheus on every node (``MetricsExportPort`` of ``ray.nodes()``, scraped
by a Ray cluster's usual monitoring; Ray prefixes the names with ``ray_``):

===========================================  =========  ========================================
name                                         kind       tags
===========================================  =========  ========================================
endpoint_runtime_messages_processed_total    counter    endpoint, message_type (counted when
                                                        the message's work commits)
endpoint_runtime_messages_failed_total       counter    endpoint, message_type (failed attempts)
endpoint_runtime_retries_total               counter    endpoint, message_type, kind (immediate,
                                                        delayed)
endpoint_runtime_moved_to_error_total        counter    endpoint, message_type
endpoint_runtime_publish_undeliverable_total counter    endpoint, message_type (copies of a
                                                        published event whose subscriber queue
                                                        does not exist: to the error queue)
endpoint_runtime_processing_seconds          histogram  endpoint, message_type
endpoint_runtime_critical_time_seconds       histogram  endpoint, message_type (TimeSent to the
                                                        end of processing, successes only)
endpoint_runtime_queue_length                gauge      endpoint (the peeker's estimate)
===========================================  =========  ========================================

A Ray metric costs about 8 us per record, too much to pay several times per message. Receivers
therefore count in memory (two dictionary look-ups per message) and hand the sums to Ray once a
second; histograms take the first ``HISTOGRAM_SAMPLES`` messages of each second and type (their
TimeSent is parsed at the flush, off the message path); the counters stay exact.
``message_type`` is a registered type's wire name, or ``unknown``: header text from outside
never becomes a tag value, so hostile input cannot grow the set of series. Each flush also
hands the interval's sums and samples to the ``sinks`` (the OpenTelemetry instruments of a
traced endpoint, :mod:`endpoint_runtime.runtime.actors.otel_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeAlias

from endpoint_runtime.chain.metrics import Metrics
from endpoint_runtime.wire.messages import Headers, from_wire_time

FLUSH_INTERVAL = 1.0
HISTOGRAM_SAMPLES = 200
PROCESSING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0, 30.0, 60.0)
CRITICAL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 300.0, 3600.0)
Counts: TypeAlias = dict[tuple[str, str, str], int]
"""An interval's increments per (counter, message type, kind)."""
Timings: TypeAlias = dict[str, list[tuple[float, float, str | None]]]
"""Per message type, an interval's first ``HISTOGRAM_SAMPLES`` (start, end, TimeSent)."""
MetricsSink: TypeAlias = Callable[[Counts, Timings], None]
"""Takes what :class:`RayMetrics` flushes, besides Ray."""




class RayMetrics(Metrics):
    """Metrics of one endpoint in one process (a receiver or a peeker actor)."""

    def __init__(self, endpoint: str) -> None:
        from ray.util import metrics  # only where Ray runs

        tags = ("endpoint", "message_type")
        self._counters = {
            name: metrics.Counter(f"endpoint_runtime_{name}_total", description=description,
                                  tag_keys=tags + (("kind",) if name == "retries" else ()))
            for name, description in (
                ("messages_processed", "messages whose handlers' work committed"),
                ("messages_failed", "failed processing attempts"),
                ("retries", "retries scheduled (kind: immediate or delayed)"),
                ("moved_to_error", "messages moved to the error queue"),
                ("publish_undeliverable",
                 "published copies whose subscriber queue does not exist (to the error queue)"),
            )
        }
        self._histograms = {
            "processing": metrics.Histogram(
                "endpoint_runtime_processing_seconds", description="handler time per message",
                boundaries=list(PROCESSING_BUCKETS), tag_keys=tags),
            "critical": metrics.Histogram(
                "endpoint_runtime_critical_time_seconds",
                description="time sent to the end of processing", boundaries=list(CRITICAL_BUCKETS),
                tag_keys=tags),
        }
        self._queue_length = metrics.Gauge("endpoint_runtime_queue_length",
                                           description="messages waiting (peek estimate)",
                                           tag_keys=("endpoint",))
        for metric in (*self._counters.values(), *self._histograms.values(), self._queue_length):
            metric.set_default_tags({"endpoint": endpoint})
        self._counts: Counts = defaultdict(int)
        self._timings: Timings = {}
        self.sinks: list[MetricsSink] = []
        """Also given each interval's sums and samples, at the flush."""
        self.last_queue_length: int | None = None
        """The last :meth:`queue_length` (a peeker's), for other exporters to observe."""
        self._flusher: asyncio.Task[None] | None = None

    def _count(self, counter: str, message_type: str, kind: str = "") -> None:
        self._counts[(counter, message_type, kind)] += 1
        self._start_flushing()

    def _start_flushing(self) -> None:
        if self._flusher is None:
            with contextlib.suppress(RuntimeError):  # no running loop: flushed by close()
                self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    def processed(self, message_type: str, started: float, ended: float,
                  headers: dict[str, str]) -> None:
        # The hot path: two dictionary look-ups; TimeSent is parsed at the flush, only for
        # the samples kept.
        self._counts[("messages_processed", message_type, "")] += 1
        timings = self._timings.get(message_type)
        if timings is None:
            timings = self._timings[message_type] = []
            self._start_flushing()
        if len(timings) < HISTOGRAM_SAMPLES:
            timings.append((started, ended, headers.get(Headers.TIME_SENT)))

    def failed(self, message_type: str, *, immediate_retry: bool) -> None:
        self._count("messages_failed", message_type)
        if immediate_retry:
            self._count("retries", message_type, "immediate")

    def delayed_retry(self, message_type: str) -> None:
        self._count("retries", message_type, "delayed")

    def moved_to_error(self, message_type: str) -> None:
        self._count("moved_to_error", message_type)

    def publish_undeliverable(self, message_type: str) -> None:
        self._count("publish_undeliverable", message_type)

    def queue_length(self, length: int) -> None:
        self._queue_length.set(length)
        self.last_queue_length = length

    def flush(self) -> None:
        counts, self._counts = self._counts, defaultdict(int)
        for (counter, message_type, kind), n in counts.items():
            tags: dict[str, Any] = {"message_type": message_type}
            if kind:
                tags["kind"] = kind
            self._counters[counter].inc(n, tags=tags)
        timings, self._timings = self._timings, {}
        for message_type, observed in timings.items():
            tags = {"message_type": message_type}
            for started, ended, sent in observed:
                self._histograms["processing"].observe(ended - started, tags=tags)
                critical = critical_seconds(sent, ended)
                if critical is not None:
                    self._histograms["critical"].observe(critical, tags=tags)
        for sink in self.sinks:
            sink(counts, timings)

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            self.flush()

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        self.flush()


def critical_seconds(sent: str | None, ended: float) -> float | None:
    """Critical time: from TimeSent (wire format) to the end of processing (epoch s)."""
    if not sent:
        return None
    try:
        return max(0.0, ended - from_wire_time(sent).timestamp())
    except ValueError:
        return None
