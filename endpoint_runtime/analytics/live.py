"""The live mode, ``--follow``: the per-minute tables kept current by Structured Streaming.

One Spark session runs two things into the same ``--out``:

- a **streaming query** over :class:`~endpoint_runtime.analytics.stream_source.
  OperationalRows` (``audit_log`` and ``error_log`` in ingestion order, by transaction
  horizon: the watermark for late rows), a micro-batch every ``options.micro_batch``
  seconds. Each micro-batch (:class:`MinuteUpdate`) appends its rows to the raw extract,
  aggregates them per minute exactly as the batch run does (:func:`~endpoint_runtime.
  analytics.minutes.minute_stats`, same schema, same KLL sketches), merges them into the
  stored rows of their minutes (counts add, sketches merge: a row of any lateness lands in
  its minute, however old), republishes those days of ``minutes`` and ``hours`` and moves the
  extract's horizon, its files marked *pending*;
- every ``interval`` seconds an **incremental batch run** (:func:`~endpoint_runtime.
  analytics.job.run`), which counts the pending files as new: it recomputes their days of
  every table whole (``exceptions``, ``flow_edges``, ``conversations``, and ``minutes``
  again, to the same figures) and redraws the page.

Both hold the output's lock and start from the extract's horizon (a micro-batch skips rows
below it), so they never interleave and never take a row twice, and a nightly run into the
same output can run between them. Spark's event-time watermark (``withWatermark``) is not
used on purpose: it drops rows older than the watermark from a stateful aggregation, and
nothing may be lost; with sketches that merge, no minute needs to stay open in state.

Example::

    with stream(spark, options, progress):
        ...  # the per-minute tables follow the database
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from endpoint_runtime.analytics import extract, outputs, session
from endpoint_runtime.analytics.jdbc import jdbc_target
from endpoint_runtime.analytics.job import exclusive, publish_minutes, run, without_adaptive
from endpoint_runtime.analytics.measures import day
from endpoint_runtime.analytics.minutes import merged_minutes, minute_stats
from endpoint_runtime.analytics.options import ReportOptions
from endpoint_runtime.analytics.prerequisites import check
from endpoint_runtime.analytics.progress import Progress
from endpoint_runtime.analytics.result import ReportResult
from endpoint_runtime.analytics.stopping import StopRequest
from endpoint_runtime.analytics.stream_source import (
    END,
    INGEST_XID,
    KIND,
    TABLES,
    OperationalRows,
)
from endpoint_runtime.errors import ConfigurationError

POLL_S = 1
"""How often (seconds) the wait between runs looks at the stream and for a stop."""


class MinuteUpdate:
    """The ``foreachBatch`` function of the streaming query: one micro-batch into the
    extract and the per-minute tables (see the module's text)."""

    def __init__(self, spark: SparkSession, out: Path, progress: Progress) -> None:
        self.spark = spark
        self.out = out
        self.progress = progress
        self._running = threading.Lock()
        self._stopping = False

    def close(self) -> None:
        """Let a micro-batch that is running finish, and run no more (stopping the query
        would interrupt one mid-write)."""
        with self._running:
            self._stopping = True

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._running, exclusive(self.out, self.progress):
            if self._stopping:
                return  # the next start reads these rows again, from the horizon
            root = self.out / "extract"
            manifest = extract.load(root)
            if manifest.horizon is None:
                raise ConfigurationError(f"{root} has no horizon: the live mode starts "
                                         f"after an incremental run")
            rows = batch.where(F.col(INGEST_XID) >= manifest.horizon).persist()
            try:
                with without_adaptive(self.spark):
                    self._apply(rows, root, manifest)
            finally:
                rows.unpersist()

    def _apply(self, rows: DataFrame, root: Path, manifest: extract.Manifest) -> None:
        self.spark.sparkContext.setJobDescription("report: live micro-batch")
        started = time.perf_counter()
        # One pass: rows, end horizon and NULL counts per table (reads the micro-batch).
        times = sorted({column for _, table in TABLES for column in table.nullable_times})
        summary = {row[KIND]: row for row in rows.groupBy(KIND).agg(
            F.count(F.lit(1)).alias("rows"), F.max(END).alias("end"),
            *(F.count(F.when(F.col(c).isNull(), True)).alias(c) for c in times)).collect()}
        if not summary:
            return  # nothing new, or only rows a batch run took first
        nulls = {f"{table.name}.{column}": int(summary[kind][column])
                 for kind, table in TABLES if kind in summary
                 for column in table.nullable_times if summary[kind][column]}
        read = time.perf_counter()
        extract.remove_unlisted(root, manifest)
        run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-live-{uuid.uuid4().hex[:8]}"
        audit = self._table(rows, "audit")
        errors = self._table(rows, "errors")
        new_files = {name: extract.append(frame, root, name, run_id) if name in summary else []
                     for name, frame in (("audit", audit), ("errors", errors))}
        days = extract.days_of([*new_files["audit"], *new_files["errors"]])
        # The horizon first: a micro-batch that stops before its minutes are published
        # leaves them short (its files are pending: the next run recomputes their days),
        # never counted twice by the next micro-batch.
        extract.save(root, manifest.streamed(max(row["end"] for row in summary.values()),
                                             new_files, nulls))
        appended = time.perf_counter()
        parquet = self.out / "parquet"
        delta = minute_stats(audit, errors)
        stored = outputs.read(self.spark, parquet / "minutes", delta.schema)
        if stored is not None:
            delta = stored.where(F.col("day").isin(sorted(days))).unionByName(delta)
        publish_minutes(self.spark, merged_minutes(delta), parquet, days)
        done = time.perf_counter()
        counted = {kind: int(summary[kind]["rows"]) if kind in summary else 0
                   for kind, _ in TABLES}
        self.progress.say(
            f"live: {counted['audit']:,} audit rows, {counted['errors']:,} failed messages; "
            f"minutes of {', '.join(sorted(days)) or 'no day'} updated (read "
            f"{read - started:.1f} s, extract {appended - read:.1f} s, minutes and hours "
            f"{done - appended:.1f} s)")

    @staticmethod
    def _table(rows: DataFrame, kind: str) -> DataFrame:
        table = dict(TABLES)[kind]
        return rows.where(F.col(KIND) == kind).select(
            *(F.col(field.name) for field in table.schema.fields), day(table.time_column))


@contextmanager
def stream(spark: SparkSession, options: ReportOptions,
           progress: Progress | None = None) -> Iterator[StreamingQuery]:
    """The streaming query, from the extract's horizon (an incremental run must have made
    it), stopped on leaving. Its checkpoint is a temporary directory: the offsets that
    matter are the extract's horizon, which every start reads again."""
    out = options.out.resolve()
    manifest = extract.load(out / "extract")
    if manifest.horizon is None:
        raise ConfigurationError(f"{out} has no horizon yet: run the report once first")
    spark.dataSource.register(OperationalRows)
    checkpoint = Path(tempfile.mkdtemp(prefix="endpoint-runtime-live-"))
    rows = (spark.readStream.format(OperationalRows.name()).option("url", options.dsn)
            .option("schema", options.schema).option("start", str(manifest.horizon)).load())
    update = MinuteUpdate(spark, out, progress or Progress(total=0))
    query = (rows.writeStream.queryName(f"endpoint-runtime live {out}")
             .foreachBatch(update)
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime=f"{options.micro_batch} seconds").start())
    try:
        yield query
    finally:
        update.close()
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


def follow(options: ReportOptions, interval: float, spark: SparkSession | None = None,
           rounds: int | None = None,
           after_round: Callable[[ReportResult], None] | None = None) -> ReportResult:
    """``--follow``: an incremental run, then the streaming query, and an incremental run
    (the page and the whole-day tables) every ``interval`` seconds, until SIGINT/SIGTERM
    (:mod:`~endpoint_runtime.analytics.stopping`: the round in progress finishes) or
    ``rounds`` runs have been made. A failed streaming query ends it with its error."""
    if options.ad_hoc:
        raise ConfigurationError("--follow keeps a horizon: it takes no --since/--until")
    progress = Progress(total=0)
    with StopRequest(progress) as stop:
        if spark is None:
            spark = session.start(options.master, check(jdbc_target(options.dsn).unix_socket),
                                  options.conf)
            stop.install()  # Spark took SIGINT over
        result = run(options, spark)
        done = 1
        if stop.requested:
            return result
        with stream(spark, options, progress) as query:
            progress.say(f"live: following {options.out.resolve()}: a micro-batch every "
                         f"{options.micro_batch:g} s, a run every {interval:g} s")
            while True:
                if after_round is not None:
                    after_round(result)
                if rounds is not None and done >= rounds:
                    return result
                if _waited(query, interval, stop):
                    progress.say(f"live: stopped ({stop.requested})")
                    return result
                result = run(options, spark)
                done += 1


def _waited(query: StreamingQuery, interval: float, stop: StopRequest) -> bool:
    """Wait ``interval`` seconds while the stream runs; whether a stop was asked for."""
    deadline = time.monotonic() + interval
    while not stop.requested and deadline > time.monotonic():
        # Raises the query's error, if any; a signal ends the wait within POLL_S.
        if query.awaitTermination(POLL_S):
            raise RuntimeError("the live mode's streaming query stopped")
    return stop.requested is not None
