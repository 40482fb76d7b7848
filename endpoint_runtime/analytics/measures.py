"""Columns every aggregate shares: the endpoint a row belongs to, percentiles, the day.

Percentiles are Spark's ``percentile_approx`` with an accuracy of 10,000: the value returned
is one of the group's values whose rank is within ``n / 10,000`` of the exact one (so exact
for groups of up to 10,000 values). It is the nearest-rank percentile: the smallest value
with at least ``p`` of the group at or below it.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

UNKNOWN = "(unknown)"
"""Stands for an endpoint or message type a row does not name."""
ACCURACY = 10_000
PERCENTILES = (0.5, 0.95, 0.99)
LABELS = ("p50", "p95", "p99")


def audit_endpoint() -> Column:
    """The endpoint that processed an audit copy."""
    return F.coalesce(F.col("processing_endpoint"), F.lit(UNKNOWN))


def failed_endpoint() -> Column:
    """The endpoint a message failed in: its processing endpoint, else the queue it failed in
    (without ``@schema``)."""
    queue = F.nullif(F.regexp_extract(F.col("failed_queue"), r"^([^@]*)", 1), F.lit(""))
    return F.coalesce(F.col("processing_endpoint"), queue, F.lit(UNKNOWN))


def sending_endpoint() -> Column:
    return F.coalesce(F.col("sending_endpoint"), F.lit(UNKNOWN))


def message_type() -> Column:
    return F.coalesce(F.col("message_type"), F.lit(UNKNOWN))


def percentiles(column: str, name: str) -> Column:
    """p50, p95 and p99 of ``column`` as one array column ``name`` (one digest per group);
    :func:`spread` turns it into ``name_p50`` ... columns."""
    return F.percentile_approx(F.col(column), list(PERCENTILES), ACCURACY).alias(name)


def spread(name: str) -> list[Column]:
    return [F.col(name)[i].alias(f"{name}_{label}") for i, label in enumerate(LABELS)]


def day(column: str) -> Column:
    """The UTC day (the session's time zone is UTC) as ``yyyy-MM-dd``: the Parquet
    partition column."""
    return F.date_format(F.col(column), "yyyy-MM-dd").alias("day")
