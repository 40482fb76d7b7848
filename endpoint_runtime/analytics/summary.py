"""Per endpoint, and per endpoint and message type, over the whole window: processed,
failed, failure rate, throughput, retries, processing and critical time percentiles.

Throughput is processed messages per second between the first and the last processing end
(at least a minute)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from endpoint_runtime.analytics.measures import (
    audit_endpoint,
    failed_endpoint,
    message_type,
    percentiles,
    spread,
)


def _processed(audit: DataFrame, keys: list[str]) -> DataFrame:
    rows = audit.select(audit_endpoint().alias("endpoint"), message_type().alias("message_type"),
                        "processing_time_ms", "critical_time_ms", "retries", "processing_ended")
    return rows.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("processed"),
        percentiles("processing_time_ms", "processing_ms"),
        percentiles("critical_time_ms", "critical_ms"),
        F.sum("retries").alias("retries"),
        F.min("processing_ended").alias("first_processed"),
        F.max("processing_ended").alias("last_processed"),
    )


def _failed(errors: DataFrame, keys: list[str]) -> DataFrame:
    rows = errors.select(failed_endpoint().alias("endpoint"), message_type().alias("message_type"))
    return rows.groupBy(*keys).agg(F.count(F.lit(1)).alias("failed"))


def _level(audit: DataFrame, errors: DataFrame, keys: list[str]) -> DataFrame:
    joined = _processed(audit, keys).join(_failed(errors, keys), keys, "full")
    processed = F.coalesce(F.col("processed"), F.lit(0)).cast("long")
    failed = F.coalesce(F.col("failed"), F.lit(0)).cast("long")
    span = F.greatest(F.lit(60.0), (F.unix_micros(F.col("last_processed"))
                                    - F.unix_micros(F.col("first_processed"))) / F.lit(1e6))
    kind = F.col("message_type") if "message_type" in keys else F.lit(None).cast(StringType())
    return joined.select(
        "endpoint", kind.alias("message_type"),
        processed.alias("processed"), failed.alias("failed"),
        (failed / (processed + failed)).alias("failure_rate"),
        F.when(processed > 0, processed / span).otherwise(F.lit(0.0)).alias("per_second"),
        F.coalesce(F.col("retries"), F.lit(0)).cast("long").alias("retries"),
        *spread("processing_ms"), *spread("critical_ms"),
    )


def endpoint_summary(audit: DataFrame, errors: DataFrame) -> DataFrame:
    """Rows per endpoint (``message_type`` null: all types) and per endpoint and type."""
    totals = _level(audit, errors, ["endpoint"])
    by_type = _level(audit, errors, ["endpoint", "message_type"])
    return totals.unionByName(by_type).orderBy(
        "endpoint", F.col("message_type").asc_nulls_first())
