"""The per-minute rows in coarser buckets for plotting: a month of minutes is 43,200 points
per endpoint, more than a plot can show. The bucket is the smallest of a fixed ladder that
keeps the series under :data:`MAX_POINTS` points."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

MAX_POINTS = 360
BUCKETS = (60, 300, 600, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)


def bucket_seconds(first: datetime, last: datetime) -> int:
    span = (last - first).total_seconds() + 60
    for seconds in BUCKETS:
        if span / seconds <= MAX_POINTS:
            return seconds
    return BUCKETS[-1]


def by_endpoint(minutes: DataFrame, seconds: int) -> DataFrame:
    """Per endpoint and bucket: messages per second and the failure rate."""
    start = F.timestamp_seconds(
        F.floor(F.unix_seconds(F.col("minute")) / seconds) * seconds).alias("bucket")
    grouped = minutes.groupBy("endpoint", start).agg(
        F.sum("processed").alias("processed"), F.sum("failed").alias("failed"))
    return grouped.select(
        "endpoint", "bucket",
        (F.col("processed") / F.lit(float(seconds))).alias("per_second"),
        (F.col("failed") / (F.col("processed") + F.col("failed"))).alias("failure_rate"),
    ).orderBy("endpoint", "bucket")


def filled(points: list[tuple[datetime, float, float]], first: datetime, last: datetime,
           seconds: int) -> list[tuple[datetime, float, float]]:
    """``points`` with the buckets between ``first`` and ``last`` that saw nothing added:
    no messages per second, and no failure rate (NaN: a gap in the line, not a zero)."""
    known = {moment: (rate, failures) for moment, rate, failures in points}
    step = timedelta(seconds=seconds)
    result = []
    moment = first
    while moment <= last:
        rate, failures = known.get(moment, (0.0, math.nan))
        result.append((moment, rate, failures))
        moment += step
    return result
