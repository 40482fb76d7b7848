"""Columns every aggregate shares: the endpoint a row belongs to, percentiles, the day.

Percentiles come from KLL quantile sketches (Apache DataSketches, Spark's
``kll_sketch_agg_double`` with k = :data:`SKETCH_K`), which merge: the per-minute sketches
stored in Parquet give any period's percentiles without the rows
(``kll_merge_agg_double``). A sketch of up to k values holds them all, so its percentiles
are exact: the nearest-rank percentile (the smallest value with at least ``p`` of the group
at or below it). Beyond k values the value returned has a rank within
:data:`RANK_ERROR` (of n) of the exact one, with 99% confidence.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

UNKNOWN = "(unknown)"
"""Stands for an endpoint or message type a row does not name."""
SKETCH_K = 1000
RANK_ERROR = 0.0028
"""DataSketches' normalised rank error for k = 1000 (2.296 / k^0.9723, single-sided, 99%)."""
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


def sketch(column: str | Column, name: str) -> Column:
    """The KLL sketch of ``column``'s values (NULLs left out) as binary column ``name``."""
    value = F.col(column) if isinstance(column, str) else column
    return F.kll_sketch_agg_double(value.cast("double"), SKETCH_K).alias(name)


def merged(name: str) -> Column:
    """The sketches of column ``name`` merged into one (aggregate)."""
    return F.kll_merge_agg_double(F.col(name)).alias(name)


def quantiles(name: str, prefix: str) -> list[Column]:
    """``prefix_p50``, ``prefix_p95``, ``prefix_p99`` of sketch column ``name``; NULL when
    the sketch is NULL or empty."""
    sketch_column = F.col(name)
    ranks = F.array(*(F.lit(p) for p in PERCENTILES))
    values = F.when(F.kll_sketch_get_n_double(sketch_column) > 0,
                    F.kll_sketch_get_quantile_double(sketch_column, ranks))
    return [values[i].alias(f"{prefix}_{label}") for i, label in enumerate(LABELS)]


MEASURES = (("processing_sketch", "processing_ms"), ("critical_sketch", "critical_ms"),
            ("wait_sketch", "wait_ms"))
"""Sketch column and percentile prefix of each duration: processing time, critical time and
queue wait (critical minus processing time)."""


def duration_sketches() -> list[Column]:
    """The three duration sketches of a group of audit rows (aggregates)."""
    wait = F.col("critical_time_ms") - F.col("processing_time_ms")
    return [sketch("processing_time_ms", "processing_sketch"),
            sketch("critical_time_ms", "critical_sketch"), sketch(wait, "wait_sketch")]


def duration_quantiles() -> list[Column]:
    return [column for name, prefix in MEASURES for column in quantiles(name, prefix)]


def merged_durations() -> list[Column]:
    return [merged(name) for name, _ in MEASURES]


def day(column: str) -> Column:
    """The UTC day (the session's time zone is UTC) as ``yyyy-MM-dd``: the Parquet
    partition column."""
    return F.date_format(F.col(column), "yyyy-MM-dd").alias("day")
