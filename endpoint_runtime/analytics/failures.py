"""The exceptions messages failed with: per endpoint and failure group, how often, first and
last seen, in which message types.

A failure group is the one the console and ``endpoint-runtime errors groups`` show
(:mod:`endpoint_runtime.wire.failure_groups`: exception type, first line of the message with
ids, numbers and quoted values masked, innermost stack frames), as ingestion wrote it into
``error_log``; ``exception_message`` holds the group's title. A row extracted before those
columns existed groups, as before, by its exception type and its message's first line (up to
200 characters).
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
    exception_type = F.coalesce(F.col("exception_type"), F.lit(UNKNOWN))
    return errors.select(
        "time_of_failure", failed_endpoint().alias("endpoint"),
        message_type().alias("message_type"),
        exception_type.alias("exception_type"),
        F.coalesce(F.col("failure_title"), first_line).alias("exception_message"),
        F.coalesce(F.col("failure_group"), F.md5(F.concat_ws("\n", exception_type, first_line)))
        .alias("failure_group"),
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
    """Every (day, endpoint, failure group) with its exception type and title, its count and
    first/last seen."""
    failures = _failures(errors).withColumn("day", day("time_of_failure"))
    return _summarise(failures, "day", "endpoint", "failure_group", "exception_type",
                      "exception_message")


def top_exceptions(daily: DataFrame, top: int = TOP) -> DataFrame:
    """The ``top`` most frequent exceptions per endpoint over every day of ``daily`` (the
    rows of :func:`exceptions_by_day`)."""
    if "failure_group" not in daily.columns:  # days published before groups existed
        daily = daily.withColumn("failure_group", F.lit(None).cast("string"))
    # Days published before groups existed have none: they group by type and message.
    group = F.coalesce(F.col("failure_group"),
                       F.md5(F.concat_ws("\n", "exception_type", "exception_message")))
    summary = daily.withColumn("failure_group", group).groupBy(
        "endpoint", "failure_group", "exception_type", "exception_message").agg(
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
