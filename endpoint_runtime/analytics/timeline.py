"""The per-minute rows in coarser buckets for plotting: a month of minutes is 43,200 points
per endpoint, more than a plot can show. The bucket is the smallest of a fixed ladder that
keeps the series under :data:`MAX_POINTS` points. Per endpoint and bucket: messages per
second, processed, failed, retries, and the duration percentiles from the merged sketches."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from endpoint_runtime.analytics.measures import duration_quantiles, merged_durations

MAX_POINTS = 200
BUCKETS = (60, 300, 600, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
DURATIONS = ("processing_ms", "critical_ms", "wait_ms")
LABELS = ("p50", "p95", "p99")


@dataclass(frozen=True)
class Point:
    """One endpoint's bucket. Durations in ms (NaN: nothing processed in the bucket)."""

    bucket: datetime
    per_second: float
    processed: int = 0
    failed: int = 0
    retries: int = 0
    durations: tuple[tuple[float, float, float], ...] = ()
    """p50, p95, p99 of processing time, critical time and queue wait."""

    @property
    def failure_rate(self) -> float:
        total = self.processed + self.failed
        return self.failed / total if total else math.nan

    def duration(self, name: str) -> tuple[float, float, float]:
        if not self.durations:
            return (math.nan, math.nan, math.nan)
        return self.durations[DURATIONS.index(name)]


def bucket_seconds(first: datetime, last: datetime) -> int:
    span = (last - first).total_seconds() + 60
    for seconds in BUCKETS:
        if span / seconds <= MAX_POINTS:
            return seconds
    return BUCKETS[-1]


def by_endpoint(rows: DataFrame, seconds: int, time_column: str = "minute") -> DataFrame:
    """Per endpoint and bucket: counts and merged duration percentiles (one pass) from the
    per-minute (or, for buckets of an hour or more, per-hour) rows."""
    start = F.timestamp_seconds(
        F.floor(F.unix_seconds(F.col(time_column)) / seconds) * seconds).alias("bucket")
    grouped = rows.groupBy("endpoint", start).agg(
        F.sum("processed").alias("processed"), F.sum("failed").alias("failed"),
        F.sum("retries").alias("retries"), *merged_durations())
    return grouped.select(
        "endpoint", "bucket", "processed", "failed", "retries",
        (F.col("processed") / F.lit(float(seconds))).alias("per_second"),
        *duration_quantiles(),
    ).orderBy("endpoint", "bucket")


def point(row: dict[str, object], bucket: datetime) -> Point:
    def number(value: object) -> float:
        return math.nan if value is None else float(value)  # type: ignore[arg-type]

    def spread(name: str) -> tuple[float, float, float]:
        p50, p95, p99 = (number(row[f"{name}_{label}"]) for label in LABELS)
        return (p50, p95, p99)

    return Point(bucket=bucket, per_second=number(row["per_second"]),
                 processed=int(row["processed"] or 0),  # type: ignore[call-overload]
                 failed=int(row["failed"] or 0),  # type: ignore[call-overload]
                 retries=int(row["retries"] or 0),  # type: ignore[call-overload]
                 durations=tuple(spread(name) for name in DURATIONS))


def filled(points: list[Point], first: datetime, last: datetime, seconds: int) -> list[Point]:
    """``points`` with the buckets between ``first`` and ``last`` that saw nothing added:
    no messages (zero counts) and no durations (NaN: a gap in the line, not a zero)."""
    known = {p.bucket: p for p in points}
    step = timedelta(seconds=seconds)
    result = []
    moment = first
    while moment <= last:
        result.append(known.get(moment) or replace(Point(bucket=moment, per_second=0.0)))
        moment += step
    return result
