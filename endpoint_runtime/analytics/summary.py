"""Per endpoint, and per endpoint and message type, over every minute of the output:
processed, failed, failure rate, throughput, retries, processing time, critical time and
queue wait percentiles, in one pass over the per-minute rows (a ``rollup``: the per-type rows
and the per-endpoint totals together; the sketches merge, so no raw row is read).

Throughput is processed messages per second between the first and the last processing end
(at least a minute)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from endpoint_runtime.analytics.measures import duration_quantiles, merged_durations

ENDPOINT_AND_TYPE, ENDPOINT = 0, 1
"""``grouping_id`` of the rollup's levels (3, the grand total, is left out)."""


def endpoint_summary(minutes: DataFrame) -> DataFrame:
    """Rows per endpoint (``message_type`` null: all types) and per endpoint and type."""
    grouped = minutes.rollup("endpoint", "message_type").agg(
        F.grouping_id().alias("level"),
        F.sum("processed").alias("processed"), F.sum("failed").alias("failed"),
        F.sum("retries").alias("retries"), F.sum("retried").alias("retried"),
        F.min("first_ended").alias("first_processed"),
        F.max("last_ended").alias("last_processed"),
        *merged_durations(),
    ).where(F.col("level").isin(ENDPOINT_AND_TYPE, ENDPOINT))
    processed = F.coalesce(F.col("processed"), F.lit(0)).cast("long")
    failed = F.coalesce(F.col("failed"), F.lit(0)).cast("long")
    span = F.greatest(F.lit(60.0), (F.unix_micros(F.col("last_processed"))
                                    - F.unix_micros(F.col("first_processed"))) / F.lit(1e6))
    return grouped.select(
        "endpoint", "message_type",
        processed.alias("processed"), failed.alias("failed"),
        (failed / (processed + failed)).alias("failure_rate"),
        F.when(processed > 0, processed / span).otherwise(F.lit(0.0)).alias("per_second"),
        F.coalesce(F.col("retries"), F.lit(0)).cast("long").alias("retries"),
        F.coalesce(F.col("retried"), F.lit(0)).cast("long").alias("retried"),
        *duration_quantiles(),
    ).orderBy("endpoint", F.col("message_type").asc_nulls_first())
