"""The report, stage by stage: start Spark, read, aggregate, write Parquet, draw, render.

Each stage ends with the Spark action that computes it, so the times in
:attr:`ReportResult.timings` say where the time goes. The per-day aggregates go to Parquet
(``minutes``, ``exceptions``, ``flow_edges``, ``conversations``, each partitioned by ``day``;
a run replaces only the days it has data for, so runs with ``--since`` add days); the
whole-window figures go to ``summary.json`` and the HTML page.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from endpoint_runtime.analytics import plots, session
from endpoint_runtime.analytics.conversations import conversations, flow_edges, slowest
from endpoint_runtime.analytics.failures import exceptions_by_day, top_exceptions
from endpoint_runtime.analytics.jdbc import jdbc_target
from endpoint_runtime.analytics.minutes import minute_stats
from endpoint_runtime.analytics.options import ReportOptions
from endpoint_runtime.analytics.page import render
from endpoint_runtime.analytics.prerequisites import check
from endpoint_runtime.analytics.progress import Progress
from endpoint_runtime.analytics.sources import AUDIT_LOG, ERROR_LOG, Reader
from endpoint_runtime.analytics.summary import endpoint_summary
from endpoint_runtime.analytics.timeline import bucket_seconds, by_endpoint, filled

STAGES = 8
TITLE = "endpoint-runtime report"
Row = dict[str, Any]


@dataclass
class ReportResult:
    """Where a report went and what it found (the whole-window figures as plain rows)."""

    out: Path
    html: Path
    parquet: Path
    plots: dict[str, Path]
    audit_rows: int
    error_rows: int
    read_partitions: dict[str, int]
    timings: dict[str, float]
    summary: list[Row] = field(default_factory=list)
    exceptions: list[Row] = field(default_factory=list)
    edges: list[Row] = field(default_factory=list)
    slowest: list[Row] = field(default_factory=list)
    timeline: dict[str, list[tuple[datetime, float, float]]] = field(default_factory=dict)
    """Per endpoint: (bucket start, messages per second, failure rate)."""
    bucket_seconds: int = 60


def utc(value: Any) -> Any:
    """PySpark hands timestamps to Python as naive local times: make them aware, in UTC."""
    return value.astimezone(UTC) if isinstance(value, datetime) else value


def _rows(frame: DataFrame) -> list[Row]:
    return [{key: utc(value) for key, value in row.asDict(recursive=True).items()}
            for row in frame.collect()]


def _partitions(count: int) -> str:
    return "not read" if count == 0 else f"{count} read partition{'s' if count > 1 else ''}"


def _write(frame: DataFrame, path: Path) -> None:
    (frame.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
     .partitionBy("day").parquet(str(path)))


def _window(options: ReportOptions) -> str:
    def show(moment: datetime | None, default: str) -> str:
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else default

    return f"from {show(options.since, 'the first row')} until {show(options.until, 'now')}"


def run(options: ReportOptions, spark: SparkSession | None = None,
        progress: Progress | None = None) -> ReportResult:
    """Run the report; ``spark``: a session to use (tests share one), else one is started
    per ``options.master``. Raises :class:`~endpoint_runtime.analytics.prerequisites.
    MissingPrerequisiteError` when Java, PySpark or the JDBC driver is missing."""
    target = jdbc_target(options.dsn)
    prerequisites = check(target.unix_socket)
    progress = progress or Progress(total=STAGES)
    out = options.out.resolve()
    parquet = out / "parquet"
    with progress.stage("spark", "starting Spark"):
        spark = spark or session.start(options.master, prerequisites)
    reader = Reader(spark, target, options.schema, options.since, options.until,
                    options.partitions)
    with progress.stage("read", "reading audit_log and error_log over JDBC"):
        present = reader.existing(AUDIT_LOG, ERROR_LOG)
        audit = reader.read(AUDIT_LOG, AUDIT_LOG.name in present)
        errors = reader.read(ERROR_LOG, ERROR_LOG.name in present)
    progress.say(f"{audit.rows:,} audit rows ({_partitions(audit.partitions)}), "
                 f"{errors.rows:,} failed messages ({_partitions(errors.partitions)})")
    result = ReportResult(
        out=out, html=out / "report.html", parquet=parquet, plots={},
        audit_rows=audit.rows, error_rows=errors.rows,
        read_partitions={"audit_log": audit.partitions, "error_log": errors.partitions},
        timings=progress.timings)

    with progress.stage("minutes", "per endpoint, message type and minute"):
        minutes = minute_stats(audit.frame, errors.frame).persist(StorageLevel.MEMORY_AND_DISK)
        _write(minutes, parquet / "minutes")
        first, last = minutes.agg(F.min("minute"), F.max("minute")).first() or (None, None)
        if first is not None and last is not None:
            result.bucket_seconds = bucket_seconds(first, last)
        for row in by_endpoint(minutes, result.bucket_seconds).collect():
            result.timeline.setdefault(row["endpoint"], []).append(
                (utc(row["bucket"]), float(row["per_second"]), float(row["failure_rate"])))
        if result.timeline:
            buckets = [moment for points in result.timeline.values() for moment, _, _ in points]
            result.timeline = {
                name: filled(points, min(buckets), max(buckets), result.bucket_seconds)
                for name, points in result.timeline.items()}
    with progress.stage("exceptions", "top exceptions per endpoint"):
        _write(exceptions_by_day(errors.frame), parquet / "exceptions")
        result.exceptions = _rows(top_exceptions(errors.frame))
    with progress.stage("flow", "conversation flow graph"):
        _write(flow_edges(audit.frame, by_day=True), parquet / "flow_edges")
        result.edges = _rows(flow_edges(audit.frame).orderBy(
            F.col("messages").desc(), "sender", "receiver", "message_type"))
    with progress.stage("conversations", "conversations end to end"):
        conversation_rows = conversations(audit.frame, errors.frame).persist(
            StorageLevel.MEMORY_AND_DISK)
        _write(conversation_rows, parquet / "conversations")
        result.slowest = _rows(slowest(conversation_rows))
    with progress.stage("summary", "per endpoint and message type"):
        result.summary = _rows(endpoint_summary(audit.frame, errors.frame))
    for frame in (minutes, conversation_rows, audit.frame, errors.frame):
        frame.unpersist()
    with progress.stage("render", "plots and HTML"):
        _render(options, result)
    return result


def _render(options: ReportOptions, result: ReportResult) -> None:
    directory = result.out / "plots"
    if directory.exists():
        shutil.rmtree(directory)
    bucket = f"{result.bucket_seconds // 60} min" if result.bucket_seconds < 3600 \
        else f"{result.bucket_seconds // 3600} h"
    throughput = {name: [(t, v) for t, v, _ in points]
                  for name, points in result.timeline.items()}
    failures = {name: [(t, f) for t, _, f in points] for name, points in result.timeline.items()}
    result.plots = {
        f"Throughput per endpoint (messages/s, {bucket} buckets)": plots.time_series(
            throughput, directory / "throughput.png",
            f"Throughput per endpoint (messages/s, {bucket} buckets)", "messages per second"),
        f"Failure rate per endpoint ({bucket} buckets)": plots.time_series(
            failures, directory / "failures.png",
            f"Failure rate per endpoint ({bucket} buckets)", "failed / (processed + failed), %",
            percent=True),
        "Latency percentiles per endpoint": plots.latency(result.summary,
                                                          directory / "latency.png"),
        "Conversation flow": plots.flow_graph(result.edges, directory / "flow.png"),
    }
    window = _window(options)
    facts = [("window", window), ("audit rows read", f"{result.audit_rows:,}"),
             ("failed messages read", f"{result.error_rows:,}"),
             ("Parquet (partitioned by day)", str(result.parquet))]
    result.html.parent.mkdir(parents=True, exist_ok=True)
    result.html.write_text(render(
        title=TITLE, window=window, generated=datetime.now(UTC), facts=facts,
        summary=result.summary, exceptions=result.exceptions, edges=result.edges[:100],
        slowest=result.slowest,
        plots={caption: str(path.relative_to(result.out))
               for caption, path in result.plots.items()},
    ), encoding="utf-8")
    summary = {"window": window, "audit_rows": result.audit_rows,
               "error_rows": result.error_rows, "endpoints": result.summary,
               "exceptions": result.exceptions, "edges": result.edges,
               "slowest_conversations": result.slowest}
    (result.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str),
                                             encoding="utf-8")
