"""The live mode on real PostgreSQL and real Spark: a Structured Streaming query over
``audit_log``/``error_log`` (in ingestion order, by transaction horizon) keeps the per-minute
tables current while rows arrive; a row committed late, whose minute already has rows, and
one whose day the output does not hold yet, land in their minutes; the next run of
``--follow``, and a full run into a fresh output, agree with what the stream wrote."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from endpoint_runtime.analytics import ReportOptions, extract, live
from endpoint_runtime.analytics.job import exclusive
from endpoint_runtime.analytics.progress import Progress
from endpoint_runtime.analytics.result import ReportResult
from endpoint_runtime.ingestion.storage import AUDIT_FIELDS, ERROR_FIELDS
from tests.analytics.audit_set import error_row, insert
from tests.analytics.test_incremental import TABLES, in_thread, orders, report, table

START = datetime(2026, 4, 6, 10, tzinfo=UTC)
NO_DATA_PROGRESS = "spark.sql.streaming.noDataProgressEventInterval"
WAIT_S = 120.0
"""The stream shows new rows within a micro-batch or two; the machine may be loaded."""


def processed(spark: SparkSession, out: Path) -> dict[tuple[datetime, str], tuple[int, int]]:
    """(minute, endpoint) -> (processed, failed), from the per-minute table as published
    (read under the output's lock, as a run would: a micro-batch replaces days)."""
    with exclusive(out, Progress(total=0)):
        return {(row["minute"].astimezone(UTC), row["endpoint"]): (row["processed"], row["failed"])
                for row in spark.read.parquet(str(out / "parquet" / "minutes")).collect()}


async def shows(spark: SparkSession, out: Path, query: StreamingQuery, minute: datetime,
                endpoint: str, expected: tuple[int, int]
                ) -> dict[tuple[datetime, str], tuple[int, int]]:
    """Wait, with a timeout, until the per-minute table shows ``expected`` for the minute."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found = processed(spark, out)
        if found.get((minute, endpoint)) == expected:
            return found
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, (minute, endpoint, expected, found)
        await asyncio.sleep(0.5)


async def triggered_after(query: StreamingQuery, moment: datetime) -> None:
    """Wait, with a timeout, until a trigger that started after ``moment`` has reported: it
    asked the database for the horizon after ``moment``."""
    deadline = time.monotonic() + WAIT_S
    while not any(datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")) > moment
                  for p in query.recentProgress):
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, query.recentProgress[-1:]
        await asyncio.sleep(0.2)


def test_the_live_mode_streams_new_and_late_rows_into_their_minutes(
        spark: SparkSession, database_dsn: str, tmp_path: Path) -> None:
    """``--follow`` for two runs: the first makes the horizon and starts the stream, during
    which rows arrive (the scenario below); the second recomputes the streamed days."""
    out = tmp_path / "live"
    in_thread(insert(database_dsn, orders("a", START, 3)))
    options = ReportOptions(dsn=database_dsn, out=out, render=False, micro_batch=0.5)
    streamed: list[list[dict[str, Any]]] = []

    def while_streaming(result: ReportResult) -> None:
        if not streamed:
            assert result.audit_rows == 3
            (query,) = spark.streams.active
            in_thread(arrivals(spark, database_dsn, out, query))
            assert extract.load(out / "extract").pending["audit"]  # their days not yet redone
            streamed.append(table(spark, out, "minutes"))

    spark.conf.set(NO_DATA_PROGRESS, "100ms")  # a progress event per idle trigger
    try:
        after = live.follow(options, 0.01, spark, rounds=2, after_round=while_streaming)
    finally:
        spark.conf.unset(NO_DATA_PROGRESS)
    assert not spark.streams.active
    assert sum(row["processed"] for row in streamed[0]) == 11
    # The second run recomputes the pending days from the extract: the same minutes, and the
    # streamed rows now in every table; one full run into a fresh output agrees.
    assert after.audit_rows == 0
    assert table(spark, out, "minutes") == streamed[0]
    assert not any(extract.load(out / "extract").pending.values())
    assert len(table(spark, out, "conversations")) == 11
    report(spark, database_dsn, tmp_path / "whole")
    for name in TABLES:
        assert table(spark, out, name) == table(spark, tmp_path / "whole", name), name


async def arrivals(spark: SparkSession, dsn: str, out: Path, query: StreamingQuery) -> None:
    """Rows committed while the stream runs, and a transaction that commits late."""
    late_row: list[Any] = list(orders("late", START + timedelta(seconds=30), 1)[0])
    earlier_day: list[Any] = list(orders("early", START - timedelta(days=1), 1)[0])
    await insert(dsn, orders("b", START + timedelta(minutes=5), 4),
                 [error_row(1, "Orders.PlaceOrder", "web", "sales",
                            START + timedelta(minutes=5, seconds=9), "E", "boom")],
                 setup=False)
    await shows(spark, out, query, START + timedelta(minutes=5), "sales", (4, 1))
    # A transaction that writes rows for minutes the output already closed (10:00, and a
    # day it does not hold yet) and stays open while a later one commits: the horizon (the
    # stream's watermark) stops at it, so the later rows wait too.
    late = await asyncpg.connect(dsn)
    transaction = late.transaction()
    await transaction.start()
    await late.copy_records_to_table("audit_log", records=[tuple(late_row),
                                                           tuple(earlier_day)],
                                     columns=AUDIT_FIELDS)
    await insert(dsn, orders("c", START + timedelta(minutes=6), 2), setup=False)
    await triggered_after(query, datetime.now(UTC))
    found = processed(spark, out)
    assert (START + timedelta(minutes=6), "sales") not in found
    assert found[(START, "sales")] == (3, 0)
    await late.copy_records_to_table("error_log", records=[error_row(
        2, "Orders.PlaceOrder", "web", "sales", START + timedelta(seconds=40), "E",
        "late")], columns=ERROR_FIELDS)
    await transaction.commit()
    await late.close()
    found = await shows(spark, out, query, START, "sales", (4, 1))
    assert found[(START - timedelta(days=1), "sales")] == (1, 0)
    assert found[(START + timedelta(minutes=5), "sales")] == (4, 1)
    assert found[(START + timedelta(minutes=6), "sales")] == (2, 0)
