"""The exceptions messages failed with: per endpoint, exception type and message, how often,
first and last seen, in which message types.

Exception messages are grouped by their first line (up to 200 characters): the rest often
holds ids that would make every failure its own group.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from endpoint_runtime.analytics.measures import UNKNOWN, day, failed_endpoint, message_type

TOP = 10
"""Exceptions kept per endpoint in the report."""
MESSAGE_CHARS = 200
TYPES_SHOWN = 5


def _failures(errors: DataFrame) -> DataFrame:
    errors = errors.where(F.col("time_of_failure").isNotNull())
    first_line = F.substring(F.split(F.coalesce(F.col("exception_message"), F.lit("")),
                                     "\n", 2)[0], 1, MESSAGE_CHARS)
    return errors.select(
        "time_of_failure", failed_endpoint().alias("endpoint"),
        message_type().alias("message_type"),
        F.coalesce(F.col("exception_type"), F.lit(UNKNOWN)).alias("exception_type"),
        first_line.alias("exception_message"),
    )


def _summarise(failures: DataFrame, *keys: str) -> DataFrame:
    return failures.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("count"),
        F.min("time_of_failure").alias("first_seen"),
        F.max("time_of_failure").alias("last_seen"),
        F.slice(F.array_sort(F.collect_set("message_type")), 1, TYPES_SHOWN)
        .alias("message_types"),
    )


def exceptions_by_day(errors: DataFrame) -> DataFrame:
    """Every (day, endpoint, exception type, message) with its count and first/last seen."""
    failures = _failures(errors).withColumn("day", day("time_of_failure"))
    return _summarise(failures, "day", "endpoint", "exception_type", "exception_message")


def top_exceptions(daily: DataFrame, top: int = TOP) -> DataFrame:
    """The ``top`` most frequent exceptions per endpoint over every day of ``daily`` (the
    rows of :func:`exceptions_by_day`)."""
    summary = daily.groupBy("endpoint", "exception_type", "exception_message").agg(
        F.sum("count").alias("count"),
        F.min("first_seen").alias("first_seen"),
        F.max("last_seen").alias("last_seen"),
        F.slice(F.array_sort(F.array_distinct(F.flatten(F.collect_list("message_types")))),
                1, TYPES_SHOWN).alias("message_types"),
    )
    rank = F.row_number().over(Window.partitionBy("endpoint").orderBy(
        F.col("count").desc(), F.col("last_seen").desc(), F.col("exception_type")))
    return (summary.withColumn("rank", rank).where(F.col("rank") <= top)
            .orderBy("endpoint", "rank"))
