"""The report, stage by stage: start Spark, extract, aggregate, write Parquet, draw, render.

Two kinds of run:

- **incremental** (no ``--since``/``--until``): the rows new since the extract's horizon go
  from the database to the raw extract (:mod:`~endpoint_runtime.analytics.extract`); the days
  they touch are recomputed whole from the extract's rows and published by rename
  (:mod:`~endpoint_runtime.analytics.outputs`); then the manifest moves the horizon. Run it
  as often as you like into the same ``--out``: late rows are picked up by the next run.
- **ad-hoc** (``--since``/``--until``): the window's rows are read from the database, every
  table of ``--out`` is replaced, and no horizon is kept or moved.

The page and ``summary.json`` are computed from the Parquet tables (the per-minute sketches
merge), so they cover every day the output holds. Each stage ends with the Spark action that
computes it, so the times in :attr:`ReportResult.timings` say where the time goes.
"""

from __future__ import annotations

import fcntl
import math
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from endpoint_runtime.analytics import extract, outputs, session
from endpoint_runtime.analytics.compaction import compacted
from endpoint_runtime.analytics.conversations import (
    conversations,
    conversations_of_days,
    edges_overall,
    flow_edges,
    slowest,
    touched_days,
)
from endpoint_runtime.analytics.failures import exceptions_by_day, top_exceptions
from endpoint_runtime.analytics.jdbc import jdbc_target
from endpoint_runtime.analytics.measures import day
from endpoint_runtime.analytics.minutes import hour_stats, minute_stats
from endpoint_runtime.analytics.options import ReportOptions
from endpoint_runtime.analytics.prerequisites import check
from endpoint_runtime.analytics.progress import Progress
from endpoint_runtime.analytics.rendering import render_report
from endpoint_runtime.analytics.result import ReportResult, Row
from endpoint_runtime.analytics.sources import AUDIT_LOG, ERROR_LOG, Reader, Table, XidRange
from endpoint_runtime.analytics.summary import endpoint_summary
from endpoint_runtime.analytics.timeline import bucket_seconds, by_endpoint, filled, point
from endpoint_runtime.errors import ConfigurationError

STAGES = 8
TABLES = ("minutes", "hours", "exceptions", "flow_edges", "conversations")
ROWS_PER_SHUFFLE_PARTITION = 500_000
MAX_SHUFFLE_PARTITIONS = 400
ADAPTIVE = "spark.sql.adaptive.enabled"
SCHEMAS = {"audit": AUDIT_LOG.schema, "errors": ERROR_LOG.schema}


@dataclass
class Inputs:
    """The rows a run aggregates: every row (``audit``, ``errors``) and, in an incremental
    run, which of them are new (``None``: recompute everything)."""

    audit: DataFrame
    errors: DataFrame
    old_audit: DataFrame | None = None
    new_audit: DataFrame | None = None
    new_errors: DataFrame | None = None
    known_conversations: DataFrame | None = None
    """The ``conversations`` table of the runs before, when it holds every conversation of
    ``old_audit`` (``conversations.touched_days``)."""


def utc(value: Any) -> Any:
    """PySpark hands timestamps to Python as naive local times: make them aware, in UTC."""
    return value.astimezone(UTC) if isinstance(value, datetime) else value


def _rows(frame: DataFrame) -> list[Row]:
    return [{key: utc(value) for key, value in row.asDict(recursive=True).items()
             if not key.endswith("_sketch")} for row in frame.collect()]


def _partitions(count: int) -> str:
    return "not read" if count == 0 else f"{count} read partition{'s' if count > 1 else ''}"


@contextmanager
def exclusive(out: Path, progress: Progress) -> Iterator[None]:
    """One writer per output directory at a time: a nightly run and a round of ``--follow``
    wait for each other, they never interleave."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / ".report.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.say(f"waiting for another report writing to {out}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run(options: ReportOptions, spark: SparkSession | None = None,
        progress: Progress | None = None) -> ReportResult:
    """Run the report; ``spark``: a session to use (tests share one), else one is started
    per ``options.master``. Raises :class:`~endpoint_runtime.analytics.prerequisites.
    MissingPrerequisiteError` when Java, PySpark or the JDBC driver is missing."""
    target = jdbc_target(options.dsn)
    prerequisites = check(target.unix_socket)
    progress = progress or Progress(total=STAGES)
    out = options.out.resolve()
    with exclusive(out, progress):
        with progress.stage("spark", "starting Spark"):
            spark = spark or session.start(options.master, prerequisites, options.conf)
        progress.entered = session.job_names(spark)
        address = session.ui_address(spark)
        if address:
            progress.say(f"Spark UI: {address}")
        reader = Reader(spark, target, options.dsn, options.schema, options.since,
                        options.until, options.partitions)
        result = ReportResult(out=out, html=out / "report.html", parquet=out / "parquet",
                              plots={}, audit_rows=0, error_rows=0, read_partitions={},
                              timings=progress.timings, incremental=not options.ad_hoc)
        if options.ad_hoc:
            inputs, publish_days, conversation_days = _ad_hoc(reader, result, progress)
            manifest = None
        else:
            manifest, inputs, publish_days, conversation_days = _incremental(
                spark, reader, result, progress)
        with _sized_shuffles(spark, options, result, whole=publish_days is None):
            _aggregate(spark, inputs, result, publish_days, conversation_days, progress)
            if manifest is not None:
                dropped: list[str] = []
                if options.keep_days is not None:
                    manifest, dropped = extract.expired(manifest, _cutoff(options.keep_days))
                manifest, merged = compacted(spark, out / "extract", manifest, SCHEMAS,
                                             options.compact_at, _run_id())
                extract.save(out / "extract", manifest)
                outputs.clear_interrupted(result.parquet)  # its days are redone now
                dropped.extend(merged)
                _expire(out, dropped, options.keep_days)
                result.horizon = manifest.horizon
                from endpoint_runtime.analytics.registration import register_horizon

                register_horizon(options, out, manifest.horizon, progress)
            with progress.stage("summary", "page figures from the Parquet tables"):
                if options.render:
                    page_figures(spark, result)
            with progress.stage("render", "plots and HTML"):
                if options.render:
                    render_report(options, result)
    return result


def _cutoff(keep_days: int) -> str:
    return (datetime.now(UTC).date() - timedelta(days=keep_days)).isoformat()


def _expire(out: Path, dropped: list[str], keep_days: int | None) -> None:
    """Retention of the extract (files already out of the manifest) and of the tables."""
    for name in dropped:
        (out / "extract" / name).unlink(missing_ok=True)
    if keep_days is None:
        return
    cutoff = _cutoff(keep_days)
    for name in TABLES:
        for folder in (out / "parquet" / name).glob("day=*"):
            if folder.name.removeprefix("day=") < cutoff:
                shutil.rmtree(folder)


def _ad_hoc(reader: Reader, result: ReportResult,
            progress: Progress) -> tuple[Inputs, None, None]:
    if (result.out / "extract" / extract.MANIFEST).exists():
        raise ConfigurationError(
            f"{result.out} holds an incremental report (its extract): an ad-hoc report with "
            f"--since/--until goes to another --out")
    with progress.stage("read", "reading audit_log and error_log over JDBC"):
        present = reader.existing(AUDIT_LOG, ERROR_LOG)
        audit = reader.read(AUDIT_LOG, AUDIT_LOG.name in present)
        errors = reader.read(ERROR_LOG, ERROR_LOG.name in present)
    _say_read(progress, result, audit.rows, audit.partitions, errors.rows, errors.partitions)
    audit_frame = audit.frame.withColumn("day", day("processing_ended"))
    error_frame = errors.frame.withColumn("day", day("time_of_failure"))
    result.null_counts = {**audit.null_counts, **errors.null_counts}
    return Inputs(audit=audit_frame, errors=error_frame), None, None


def _say_read(progress: Progress, result: ReportResult, audit_rows: int, audit_parts: int,
              error_rows: int, error_parts: int) -> None:
    result.audit_rows, result.error_rows = audit_rows, error_rows
    result.read_partitions = {"audit_log": audit_parts, "error_log": error_parts}
    progress.say(f"{audit_rows:,} audit rows ({_partitions(audit_parts)}), "
                 f"{error_rows:,} failed messages ({_partitions(error_parts)})")


def _incremental(spark: SparkSession, reader: Reader, result: ReportResult,
                 progress: Progress) -> tuple[extract.Manifest, Inputs, set[str] | None,
                                              set[str] | None]:
    root = result.out / "extract"
    if not root.exists() and result.parquet.exists():
        # Written by a version without the extract: rebuilt, the old tables kept aside.
        aside = result.out / f"parquet-before-extract-{datetime.now(UTC):%Y%m%dT%H%M%S}"
        result.parquet.rename(aside)
        progress.say(f"{result.parquet} predates the extract: moved to {aside}, rebuilt")
    root.mkdir(parents=True, exist_ok=True)
    manifest = extract.load(root)
    first = not any(manifest.files.values())
    extract.remove_unlisted(root, manifest)
    run_id = _run_id()
    with progress.stage("read", "new rows of audit_log and error_log to the extract"):
        present, with_xid, horizon = reader.survey(AUDIT_LOG, ERROR_LOG)
        for table in (AUDIT_LOG, ERROR_LOG):
            if table.name in present and table.name not in with_xid:
                raise ConfigurationError(
                    f"{reader.qualified(table)} has no ingest_xid column (made by an older "
                    f"version): start ingestion once (it adds the column), then report")
        xids = XidRange(manifest.horizon, horizon)
        new_files: dict[str, list[str]] = {}
        counts = []
        new_nulls: dict[str, int] = {}
        for table, name in ((AUDIT_LOG, "audit"), (ERROR_LOG, "errors")):
            source = reader.read_new(table, xids, table.name in present)
            counts.append((source.rows, source.partitions))
            new_nulls.update(source.null_counts)
            new_files[name] = [] if source.rows == 0 else extract.append(
                source.frame.withColumn("day", day(table.time_column)), root, name, run_id)
    _say_read(progress, result, counts[0][0], counts[0][1], counts[1][0], counts[1][1])

    def frame(table: Table, name: str, files: list[str]) -> DataFrame:
        return extract.read(spark, root, name, table.schema, files)

    # Files the live mode streamed in (their minutes are current, their days not yet
    # recomputed) count as new here.
    pending = {name: set(manifest.pending.get(name, [])) for name in extract.TABLES}
    old_audit = frame(AUDIT_LOG, "audit", [f for f in manifest.files["audit"]
                                           if f not in pending["audit"]])
    old_errors = frame(ERROR_LOG, "errors", [f for f in manifest.files["errors"]
                                             if f not in pending["errors"]])
    # The days of the new rows are their files' folders (no Spark job needed).
    days = extract.days_of([*new_files["audit"], *new_files["errors"]]) | \
        manifest.pending_days()
    new_audit = frame(AUDIT_LOG, "audit", [*manifest.pending["audit"], *new_files["audit"]])
    new_errors = frame(ERROR_LOG, "errors", [*manifest.pending["errors"],
                                             *new_files["errors"]])
    # The table holds every conversation of the old rows under its start day, unless
    # retention deleted a day or a publish stopped half-way (a day moved aside): then the
    # old rows decide, as the run that stopped did.
    known = None if (first or manifest.expired_before is not None
                     or outputs.interrupted(result.parquet)) else outputs.read(
        spark, result.parquet / "conversations")
    manifest = manifest.advanced(horizon, new_files, new_nulls)
    result.null_counts = dict(manifest.null_counts)
    inputs = Inputs(audit=old_audit.unionByName(new_audit),
                    errors=old_errors.unionByName(new_errors), old_audit=old_audit,
                    new_audit=new_audit, new_errors=new_errors, known_conversations=known)
    if first:
        return manifest, inputs, None, None  # the first rows: everything is new
    conversation_days = touched_days(old_audit, new_audit, new_errors, known) if days else set()
    return manifest, inputs, days, conversation_days


def _run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


@contextmanager
def _sized_shuffles(spark: SparkSession, options: ReportOptions, result: ReportResult,
                    whole: bool) -> Iterator[None]:
    """Shuffle partitions from the input: one per 500,000 rows, at least one per core
    (adaptive execution coalesces small ones), unless ``--conf`` set them. A run that
    recomputes a few days from few new rows (an incremental run, a round of ``--follow``:
    not ``whole``, one partition per core) runs without adaptive execution, unless
    ``--conf`` set it: there is little to re-plan on a day's rows, and it submits each
    shuffle stage as a Spark job of its own to re-plan after it (about twice the jobs). A
    run over everything keeps the session's setting (on by default: broadcast joins chosen
    from the actual sizes), which is back after the run."""
    given = {key for key, _ in options.conf}
    rows = result.audit_rows + result.error_rows
    cores = spark.sparkContext.defaultParallelism
    partitions = max(cores, min(MAX_SHUFFLE_PARTITIONS,
                                math.ceil(rows / ROWS_PER_SHUFFLE_PARTITION)))
    if "spark.sql.shuffle.partitions" not in given:
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    if ADAPTIVE not in given and not whole and partitions == cores:
        with without_adaptive(spark):
            yield
    else:
        yield


@contextmanager
def without_adaptive(spark: SparkSession) -> Iterator[None]:
    """Adaptive execution off for the block (a run's or a micro-batch's few rows: one Spark
    job per action rather than one per shuffle stage), the session's setting back after."""
    adaptive = spark.conf.get(ADAPTIVE, "true")
    spark.conf.set(ADAPTIVE, "false")
    try:
        yield
    finally:
        spark.conf.set(ADAPTIVE, adaptive or "true")


def _only(frame: DataFrame, days: set[str] | None) -> DataFrame:
    return frame if days is None else frame.where(F.col("day").isin(sorted(days)))


def _aggregate(spark: SparkSession, inputs: Inputs, result: ReportResult,
               days: set[str] | None,
               conversation_days: set[str] | None, progress: Progress) -> None:
    parquet = result.parquet
    audit = _only(inputs.audit, days)
    errors = _only(inputs.errors, days)
    written: set[str] = set()
    with progress.stage("minutes", "per endpoint, message type, minute and hour"):
        written.update(publish_minutes(spark, minute_stats(audit, errors), parquet, days))
    with progress.stage("exceptions", "exceptions per endpoint and day"):
        written.update(outputs.publish(exceptions_by_day(errors), parquet / "exceptions", days))
    with progress.stage("flow", "conversation flow graph per day"):
        written.update(outputs.publish(flow_edges(audit), parquet / "flow_edges", days))
    with progress.stage("conversations", "conversations end to end"):
        rows = conversations(inputs.audit, inputs.errors) if conversation_days is None else \
            conversations_of_days(inputs.audit, inputs.errors, conversation_days,
                                  inputs.known_conversations)
        written.update(outputs.publish(rows, parquet / "conversations", conversation_days))
    result.days = sorted(written | (days or set()) | (conversation_days or set()))


def publish_minutes(spark: SparkSession, minutes: DataFrame, parquet: Path,
                    days: set[str] | None) -> list[str]:
    """Replace ``days`` of the per-minute table with ``minutes``, then the same days of the
    per-hour table with the minutes merged per hour; returns the days written."""
    written = outputs.publish(minutes, parquet / "minutes", days)
    published = outputs.read(spark, parquet / "minutes", minutes.schema)
    assert published is not None  # just written
    return sorted({*written, *outputs.publish(hour_stats(_only(published, days)),
                                              parquet / "hours", days)})


def page_figures(spark: SparkSession, result: ReportResult) -> None:
    """The page's figures from the Parquet tables: every day the output holds."""
    tables = {name: outputs.read(spark, result.parquet / name) for name in TABLES}
    minutes, hours = tables["minutes"], tables["hours"]
    if minutes is None or hours is None:
        return
    hours = hours.cache()
    first, last = minutes.agg(F.min("minute"), F.max("minute")).first() or (None, None)
    if first is not None and last is not None:
        result.window = (utc(first), utc(last))
        result.bucket_seconds = bucket_seconds(first, last)
        series = by_endpoint(hours, result.bucket_seconds, "hour") \
            if result.bucket_seconds >= 3600 else by_endpoint(minutes, result.bucket_seconds)
        for row in series.collect():
            result.timeline.setdefault(row["endpoint"], []).append(
                point(row.asDict(), utc(row["bucket"])))
        buckets = [p.bucket for points in result.timeline.values() for p in points]
        result.timeline = {name: filled(points, min(buckets), max(buckets),
                                        result.bucket_seconds)
                           for name, points in result.timeline.items()}
    result.summary = _rows(endpoint_summary(hours))
    hours.unpersist()
    if tables["exceptions"] is not None:
        result.exceptions = _rows(top_exceptions(tables["exceptions"]))
    if tables["flow_edges"] is not None:
        result.edges = _rows(edges_overall(tables["flow_edges"]).orderBy(
            F.col("messages").desc(), "sender", "receiver", "message_type"))
    if tables["conversations"] is not None:
        result.slowest = _rows(slowest(tables["conversations"]))
