"""Live metrics of endpoints, exported through Ray's metrics API.

Ray serves them for Prometheus on every node (``MetricsExportPort`` of ``ray.nodes()``, scraped
by a Ray cluster's usual monitoring; Ray prefixes the names with ``ray_``):

===========================================  =========  ========================================
name                                         kind       tags
===========================================  =========  ========================================
endpoint_runtime_messages_processed_total    counter    endpoint, message_type
endpoint_runtime_messages_failed_total       counter    endpoint, message_type (failed attempts)
endpoint_runtime_retries_total               counter    endpoint, message_type, kind (immediate,
                                                        delayed)
endpoint_runtime_moved_to_error_total        counter    endpoint, message_type
endpoint_runtime_processing_seconds          histogram  endpoint, message_type
endpoint_runtime_critical_time_seconds       histogram  endpoint, message_type (TimeSent to the
                                                        end of processing, successes only)
endpoint_runtime_queue_length                gauge      endpoint (the peeker's estimate)
===========================================  =========  ========================================

A Ray metric costs about 8 us per record, too much to pay several times per message. Receivers
therefore count in memory and hand the sums to Ray once a second; histograms take at most
``HISTOGRAM_SAMPLES`` observations per second and message type (a uniform sample of them: the
counters stay exact). ``message_type`` is a registered type's wire name, or ``unknown``: header
text from outside never becomes a tag value, so hostile input cannot grow the set of series.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import defaultdict
from typing import Any

from endpoint_runtime.messages import Headers, from_wire_time

FLUSH_INTERVAL = 1.0
HISTOGRAM_SAMPLES = 200
PROCESSING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0, 30.0, 60.0)
CRITICAL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0, 300.0, 3600.0)
UNKNOWN_TYPE = "unknown"


class Metrics:
    """No metrics (outside Ray, and the base of :class:`RayMetrics`)."""

    def processed(self, message_type: str, started: float, ended: float,
                  headers: dict[str, str]) -> None:
        """A message handled; ``started``/``ended`` in epoch seconds."""

    def failed(self, message_type: str, *, immediate_retry: bool) -> None:
        """A failed attempt; ``immediate_retry``: the next step retries at once."""

    def delayed_retry(self, message_type: str) -> None: ...

    def moved_to_error(self, message_type: str) -> None: ...

    def queue_length(self, length: int) -> None: ...

    async def close(self) -> None:
        """Hand what was counted to Ray before the process ends."""


class RayMetrics(Metrics):
    """Metrics of one endpoint in one process (a receiver or a peeker actor)."""

    def __init__(self, endpoint: str) -> None:
        from ray.util import metrics  # only where Ray runs

        tags = ("endpoint", "message_type")
        self._counters = {
            name: metrics.Counter(f"endpoint_runtime_{name}_total", description=description,
                                  tag_keys=tags + (("kind",) if name == "retries" else ()))
            for name, description in (
                ("messages_processed", "messages whose handlers succeeded"),
                ("messages_failed", "failed processing attempts"),
                ("retries", "retries scheduled (kind: immediate or delayed)"),
                ("moved_to_error", "messages moved to the error queue"),
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
        self._counts: dict[tuple[str, str, str], int] = defaultdict(int)
        self._seen: dict[tuple[str, str], int] = defaultdict(int)
        self._samples: dict[tuple[str, str], list[float]] = defaultdict(list)
        self._flusher: asyncio.Task[None] | None = None

    def _count(self, counter: str, message_type: str, kind: str = "") -> None:
        self._counts[(counter, message_type, kind)] += 1
        if self._flusher is None:
            with contextlib.suppress(RuntimeError):  # no running loop: flushed by close()
                self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    def _slot(self, histogram: str, message_type: str) -> int | None:
        """Reservoir sampling: where this interval's next observation goes, or ``None`` when
        it is not kept (each observation of the interval is kept with equal chance). Asked
        before the value is computed, so that the values not kept cost nothing."""
        key = (histogram, message_type)
        self._seen[key] += 1
        samples = self._samples[key]
        if len(samples) < HISTOGRAM_SAMPLES:
            samples.append(0.0)
            return len(samples) - 1
        slot = random.randrange(self._seen[key])
        return slot if slot < HISTOGRAM_SAMPLES else None

    def processed(self, message_type: str, started: float, ended: float,
                  headers: dict[str, str]) -> None:
        self._count("messages_processed", message_type)
        slot = self._slot("processing", message_type)
        if slot is not None:
            self._samples[("processing", message_type)][slot] = ended - started
        sent = headers.get(Headers.TIME_SENT)
        if not sent:
            return
        slot = self._slot("critical", message_type)
        if slot is None:
            return
        samples = self._samples[("critical", message_type)]
        try:
            samples[slot] = ended - from_wire_time(sent).timestamp()
        except ValueError:  # not a wire time: no observation (skipped at the flush)
            samples[slot] = math.nan

    def failed(self, message_type: str, *, immediate_retry: bool) -> None:
        self._count("messages_failed", message_type)
        if immediate_retry:
            self._count("retries", message_type, "immediate")

    def delayed_retry(self, message_type: str) -> None:
        self._count("retries", message_type, "delayed")

    def moved_to_error(self, message_type: str) -> None:
        self._count("moved_to_error", message_type)

    def queue_length(self, length: int) -> None:
        self._queue_length.set(length)

    def flush(self) -> None:
        counts, self._counts = self._counts, defaultdict(int)
        for (counter, message_type, kind), n in counts.items():
            tags: dict[str, Any] = {"message_type": message_type}
            if kind:
                tags["kind"] = kind
            self._counters[counter].inc(n, tags=tags)
        samples, self._samples = self._samples, defaultdict(list)
        self._seen = defaultdict(int)
        for (histogram, message_type), values in samples.items():
            for value in values:
                if not math.isnan(value):
                    self._histograms[histogram].observe(value,
                                                        tags={"message_type": message_type})

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
