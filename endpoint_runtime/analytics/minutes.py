"""Per endpoint, message type and minute: how many processed and failed, throughput,
processing time, critical time and queue wait (sketches and their p50/p95/p99), retries and
the failure rate.

A processed message is an audit copy, counted in the minute its processing ended; a failed
one is a row of ``error_log`` (a message that reached the error queue), counted in the minute
of its failure. Rows without that time are left out (the report counts them). The failure
rate is ``failed / (processed + failed)``. The sketches merge: any period's percentiles come
from these rows (:mod:`endpoint_runtime.analytics.summary`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from endpoint_runtime.analytics.measures import (
    MEASURES,
    audit_endpoint,
    day,
    duration_quantiles,
    duration_sketches,
    failed_endpoint,
    merged_durations,
    message_type,
)

KEYS = ("minute", "endpoint", "message_type")


def processed_by_minute(audit: DataFrame) -> DataFrame:
    rows = audit.where(F.col("processing_ended").isNotNull()).select(
        F.date_trunc("minute", F.col("processing_ended")).alias("minute"),
        audit_endpoint().alias("endpoint"), message_type().alias("message_type"),
        "processing_time_ms", "critical_time_ms", "retries", "processing_ended",
    )
    return rows.groupBy(*KEYS).agg(
        F.count(F.lit(1)).alias("processed"),
        *duration_sketches(),
        F.sum("retries").alias("retries"),
        F.count(F.when(F.col("retries") > 0, True)).alias("retried"),
        F.min("processing_ended").alias("first_ended"),
        F.max("processing_ended").alias("last_ended"),
    )


def failed_by_minute(errors: DataFrame) -> DataFrame:
    rows = errors.where(F.col("time_of_failure").isNotNull()).select(
        F.date_trunc("minute", F.col("time_of_failure")).alias("minute"),
        failed_endpoint().alias("endpoint"), message_type().alias("message_type"),
    )
    return rows.groupBy(*KEYS).agg(F.count(F.lit(1)).alias("failed"))


def minute_stats(audit: DataFrame, errors: DataFrame) -> DataFrame:
    """One row per (minute, endpoint, message_type) that saw a processed or failed message,
    with a ``day`` column to partition by."""
    joined = processed_by_minute(audit).join(failed_by_minute(errors), list(KEYS), "full")
    processed = F.coalesce(F.col("processed"), F.lit(0)).cast("long")
    failed = F.coalesce(F.col("failed"), F.lit(0)).cast("long")
    return joined.select(
        day("minute"), *KEYS,
        processed.alias("processed"),
        (processed / F.lit(60.0)).alias("per_second"),
        *duration_quantiles(),
        F.coalesce(F.col("retries"), F.lit(0)).cast("long").alias("retries"),
        F.coalesce(F.col("retried"), F.lit(0)).cast("long").alias("retried"),
        failed.alias("failed"),
        (failed / (processed + failed)).alias("failure_rate"),
        "first_ended", "last_ended",
        *(name for name, _ in MEASURES),
    )


def hour_stats(minutes: DataFrame) -> DataFrame:
    """The per-minute rows merged per hour (the sketches merge): the page's summary and the
    plots of long periods read these, a sixtieth of the rows."""
    return _merged(minutes, F.date_trunc("hour", F.col("minute")).alias("hour"), "hour", 3600.0)


def merged_minutes(minutes: DataFrame) -> DataFrame:
    """Rows of :func:`minute_stats` for the same minute, endpoint and type (a minute's stored
    row and the row of rows that arrived later) merged into one: counts added, sketches
    merged, percentiles from the merged sketches."""
    return _merged(minutes, "minute", "minute", 60.0)


def _merged(minutes: DataFrame, key: Column | str, name: str, seconds: float) -> DataFrame:
    keys: list[Column | str] = ["day", key, "endpoint", "message_type"]
    grouped = minutes.groupBy(*keys).agg(
        F.sum("processed").alias("processed"), F.sum("failed").alias("failed"),
        F.sum("retries").alias("retries"), F.sum("retried").alias("retried"),
        F.min("first_ended").alias("first_ended"), F.max("last_ended").alias("last_ended"),
        *merged_durations())
    return grouped.select(
        "day", name, "endpoint", "message_type", "processed",
        (F.col("processed") / F.lit(seconds)).alias("per_second"), *duration_quantiles(),
        "retries", "retried", "failed",
        (F.col("failed") / (F.col("processed") + F.col("failed"))).alias("failure_rate"),
        "first_ended", "last_ended", *(sketch for sketch, _ in MEASURES))
