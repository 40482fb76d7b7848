"""The report on real PostgreSQL and real Spark: a known audit set gives exact counts,
percentiles (from the KLL sketches: exact for groups of up to k values), failure rates,
exceptions, flow edges and conversations; an ad-hoc window limits the input and moves no
horizon; an empty database gives an empty, readable report; the HTML page and its PNGs are
written; no ``chmod`` process is started for its files."""

from __future__ import annotations

import asyncio
import json
import math
import stat
import struct
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pyspark.sql import SparkSession

from endpoint_runtime.analytics import (
    ReportOptions,
    local_files,
    outputs,
    prerequisites,
    run_report,
)
from endpoint_runtime.analytics.job import TABLES
from endpoint_runtime.analytics.result import ReportResult
from endpoint_runtime.cli import main
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.ingestion.storage import OperationalData
from tests.analytics import audit_set
from tests.analytics.audit_set import DAY1, DAY2, HOSTILE
from tests.analytics.databases import own_database

PLOTS = ("throughput.png", "latency.png", "queue_wait.png", "failures.png", "retries.png",
         "flow.png")


def nearest_rank(values: list[float], p: float) -> float:
    """The smallest value with at least p of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


@pytest.fixture(scope="module")
def known_dsn(server_dsn: str) -> Iterator[str]:
    """A database holding the known audit set, shared by this module's tests (they only
    read it)."""
    with own_database(server_dsn, "report") as dsn:
        asyncio.run(audit_set.load(dsn))
        yield dsn


@pytest.fixture(scope="module")
def report(spark: SparkSession, known_dsn: str,
           tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    out = tmp_path_factory.mktemp("report")
    return run_report(ReportOptions(dsn=known_dsn, out=out), spark)


def _minutes(spark: SparkSession, result: ReportResult) -> dict[tuple[Any, ...], Any]:
    rows = spark.read.parquet(str(result.parquet / "minutes")).collect()
    return {(str(row["day"]), row["minute"].astimezone(UTC), row["endpoint"],
             row["message_type"]): row for row in rows}


def test_per_minute_counts_percentiles_retries_and_failure_rates(
        spark: SparkSession, report: ReportResult) -> None:
    minutes = _minutes(spark, report)
    assert set(minutes) == {
        ("2026-01-05", DAY1, "sales", "Orders.PlaceOrder"),
        ("2026-01-05", DAY1 + timedelta(minutes=1), "billing", "Orders.OrderPlaced"),
        ("2026-01-06", DAY2, "sales", "Orders.PlaceOrder"),
    }
    sales = minutes[("2026-01-05", DAY1, "sales", "Orders.PlaceOrder")]
    assert (sales["processed"], sales["failed"], sales["retries"], sales["retried"]) == (
        100, 1, 10, 10)
    assert sales["failure_rate"] == pytest.approx(1 / 101)
    assert sales["per_second"] == pytest.approx(100 / 60)
    processing = [float(i) for i in range(1, 101)]
    critical = [10.0 * i for i in range(1, 101)]
    for label, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        # 100 values: within percentile_approx's exact range (accuracy 10,000).
        assert sales[f"processing_ms_{label}"] == nearest_rank(processing, p)
        assert sales[f"critical_ms_{label}"] == nearest_rank(critical, p)
    billing = minutes[("2026-01-05", DAY1 + timedelta(minutes=1), "billing",
                       "Orders.OrderPlaced")]
    assert (billing["processed"], billing["failed"]) == (50, 5)
    assert billing["failure_rate"] == pytest.approx(5 / 55)
    assert billing["processing_ms_p99"] == 2.0
    assert billing["critical_ms_p50"] == 20.0
    later = minutes[("2026-01-06", DAY2, "sales", "Orders.PlaceOrder")]
    assert (later["processed"], later["failed"], later["failure_rate"]) == (20, 0, 0.0)
    days = sorted(path.name for path in (report.parquet / "minutes").glob("day=*"))
    assert days == ["day=2026-01-05", "day=2026-01-06"]


def test_endpoint_summary(report: ReportResult) -> None:
    totals = {row["endpoint"]: row for row in report.summary if row["message_type"] is None}
    assert set(totals) == {"sales", "billing"}
    assert (totals["sales"]["processed"], totals["sales"]["failed"]) == (120, 1)
    assert totals["sales"]["failure_rate"] == pytest.approx(1 / 121)
    assert (totals["billing"]["processed"], totals["billing"]["failed"]) == (50, 5)
    assert totals["billing"]["retries"] == 0
    critical = [10.0 * i for i in range(1, 101)] + [50.0] * 20
    assert totals["sales"]["critical_ms_p95"] == nearest_rank(critical, 0.95)
    assert report.audit_rows == 170
    assert report.error_rows == 6


def test_flow_edges(report: ReportResult) -> None:
    edges = {(e["sender"], e["receiver"], e["message_type"]): e for e in report.edges}
    assert set(edges) == {("web", "sales", "Orders.PlaceOrder"),
                          ("sales", "billing", "Orders.OrderPlaced")}
    orders = edges[("web", "sales", "Orders.PlaceOrder")]
    assert orders["messages"] == 120
    latencies = [10.0 * i for i in range(1, 101)] + [50.0] * 20
    for label, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert orders[f"latency_ms_{label}"] == nearest_rank(latencies, p)
    placed = edges[("sales", "billing", "Orders.OrderPlaced")]
    assert placed["messages"] == 50
    assert placed["latency_ms_p50"] == placed["latency_ms_p99"] == 20.0
    assert placed["first_seen"] == audit_set.billing_end(1)
    assert placed["last_seen"] == audit_set.billing_end(50)


def test_top_exceptions(report: ReportResult) -> None:
    found = {(e["endpoint"], e["exception_type"]): e for e in report.exceptions}
    assert set(found) == {("billing", "System.TimeoutException"),
                          ("sales", "System.ArgumentException")}
    timeout = found[("billing", "System.TimeoutException")]
    # Grouped by the first line: the stack trace lines differ.
    assert (timeout["exception_message"], timeout["count"]) == ("gateway timed out", 5)
    assert timeout["first_seen"] == DAY1 + timedelta(minutes=1, seconds=1)
    assert timeout["last_seen"] == DAY1 + timedelta(minutes=1, seconds=5)
    assert timeout["message_types"] == ["Orders.OrderPlaced"]
    assert found[("sales", "System.ArgumentException")]["exception_message"] == HOSTILE


def test_slowest_conversations(spark: SparkSession, report: ReportResult) -> None:
    slowest = report.slowest
    assert [c["conversation_id"] for c in slowest[:3]] == ["c-50", "c-49", "c-48"]
    first = slowest[0]
    assert first["duration_ms"] == pytest.approx(audit_set.conversation_ms(50), abs=0.01)
    assert (first["messages"], first["endpoints"]) == (2, ["billing", "sales"])
    assert (first["initiating_type"], first["initiating_endpoint"]) == (
        "Orders.PlaceOrder", "web")
    assert first["started"] == audit_set.place_order_end(50) - timedelta(milliseconds=500)
    everything = spark.read.parquet(str(report.parquet / "conversations"))
    assert everything.count() == 120  # c-1..c-100 and d-1..d-20


def test_html_and_plots(report: ReportResult) -> None:
    page = report.html.read_text(encoding="utf-8")
    for name in PLOTS:
        png = report.out / "plots" / name
        header = png.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", header[16:24])
        assert width >= 800
        assert height >= 250
        assert f'src="plots/{name}"' in page
    assert "&lt;b&gt;bad&lt;/b&gt; order &amp; more" in page  # escaped, not markup
    assert "<b>bad</b>" not in page
    assert "c-50" in page
    assert "System.TimeoutException" in page
    summary = json.loads((report.out / "summary.json").read_text(encoding="utf-8"))
    assert summary["audit_rows"] == 170


def test_since_on_the_command_line(known_dsn: str, tmp_path: Path, spark: SparkSession,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", known_dsn)
    status = main(["report", "--since", "2026-01-06", "--out", str(tmp_path / "since")])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    assert f"report: {tmp_path / 'since' / 'report.html'}" in printed.out.splitlines()
    assert "[2/8] reading audit_log and error_log over JDBC" in printed.err
    summary = json.loads((tmp_path / "since" / "summary.json").read_text(encoding="utf-8"))
    assert (summary["audit_rows"], summary["error_rows"]) == (20, 0)
    assert (summary["incremental"], summary["horizon"]) == (False, None)
    days = [path.name for path in (tmp_path / "since" / "parquet" / "minutes").glob("day=*")]
    assert days == ["day=2026-01-06"]
    assert not (tmp_path / "since" / "extract").exists()  # no horizon kept


async def test_an_empty_database_gives_an_empty_report(
        spark: SparkSession, database_dsn: str, tmp_path: Path) -> None:
    # No tables at all (ingestion never ran), then empty tables.
    for attempt in ("no tables", "empty tables"):
        if attempt == "empty tables":
            connection = await asyncpg.connect(database_dsn)
            await OperationalData("public").setup(connection)
            await connection.close()
        out = tmp_path / attempt.replace(" ", "-")
        result = run_report(ReportOptions(dsn=database_dsn, out=out), spark)
        assert (result.audit_rows, result.error_rows) == (0, 0), attempt
        assert result.summary == result.edges == result.slowest == result.exceptions == []
        assert result.html.exists()
        assert "none" in result.html.read_text(encoding="utf-8")
        assert all((out / "plots" / name).stat().st_size > 1000 for name in PLOTS)
        # Readable, empty tables with their columns (not folders without files).
        for table in ("minutes", "hours", "exceptions", "flow_edges", "conversations"):
            frame = spark.read.parquet(str(out / "parquet" / table))
            assert frame.count() == 0, (attempt, table)
            assert "day" in frame.columns


def test_an_ad_hoc_window_never_writes_into_an_incremental_output(
        known_dsn: str, report: ReportResult) -> None:
    with pytest.raises(ConfigurationError, match="incremental report"):
        run_report(ReportOptions(dsn=known_dsn, out=report.out, since=DAY2))


def test_plot_series_have_every_bucket(report: ReportResult) -> None:
    # 23 hours of data: 10-minute buckets; empty ones count 0 messages and no failure rate.
    assert report.bucket_seconds == 600
    sales, billing = report.timeline["sales"], report.timeline["billing"]
    assert len(sales) == len(billing) == 23 * 6 + 1
    assert (sales[0].bucket, sales[0].processed, sales[0].failed, sales[0].retries) == (
        DAY1, 100, 1, 10)
    assert sales[0].per_second == pytest.approx(100 / 600)
    assert sales[0].failure_rate == pytest.approx(1 / 101)
    assert sales[0].duration("processing_ms") == (50.0, 95.0, 99.0)
    assert billing[0].per_second == pytest.approx(50 / 600)
    assert billing[0].failure_rate == pytest.approx(5 / 55)
    assert billing[0].duration("wait_ms") == (18.0, 18.0, 18.0)
    assert (sales[1].per_second, sales[1].processed) == (0.0, 0)
    assert math.isnan(sales[1].failure_rate)
    assert math.isnan(sales[1].duration("critical_ms")[0])
    assert (sales[-1].bucket, sales[-1].processed, sales[-1].failure_rate) == (DAY2, 20, 0.0)


def test_each_day_of_each_table_is_one_file(spark: SparkSession, report: ReportResult,
                                             tmp_path: Path) -> None:
    """The known report's tables, and a frame of four partitions over three days published:
    one Parquet file per day partition (the frame is partitioned by day before the write),
    every row kept. Written as it comes, the frame would leave up to four files per day."""
    for name in TABLES:
        days = sorted((report.parquet / name).glob("day=*"))
        assert days, name
        for folder in days:
            assert len(list(folder.glob("*.parquet"))) == 1, (name, folder.name)
    frame = spark.createDataFrame(
        [(f"2026-03-0{day}", value) for value in range(20) for day in (1, 2, 3)],
        "day string, value int").repartition(4)
    table = tmp_path / "table"
    assert outputs.publish(frame, table, None) == ["2026-03-01", "2026-03-02", "2026-03-03"]
    for folder in table.glob("day=*"):
        assert len(list(folder.glob("*.parquet"))) == 1, folder.name
    assert spark.read.parquet(str(table)).count() == 60


def test_a_local_report_starts_no_chmod_and_files_keep_hadoops_permissions(
        spark: SparkSession, report: ReportResult, tmp_path: Path, chmod_calls: Path) -> None:
    """Hadoop's local file system, without its native library, starts a ``chmod`` process
    per file and directory it writes; the report's does not (endpoint_runtime/analytics/
    local_files.py). The session's JVM notes every ``chmod`` it starts (conftest.py)."""
    if local_files.jar(prerequisites.find_java()[0]) is None:
        pytest.skip("no javac beside java: Spark keeps Hadoop's chmod processes by design")
    jvm = spark._jvm
    assert jvm is not None
    hadoop = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    root = jvm.java.net.URI("file:///")
    # The check can fail: Hadoop's own local file system starts one for a directory.
    stock = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    stock.initialize(root, hadoop)
    stock.mkdirs(jvm.org.apache.hadoop.fs.Path(str(tmp_path / "stock")))
    assert str(tmp_path / "stock") in chmod_calls.read_text(encoding="utf-8")
    files = jvm.org.apache.hadoop.fs.FileSystem.get(root, hadoop)
    assert files.getClass().getName() == local_files.CLASS
    assert str(report.out) not in chmod_calls.read_text(encoding="utf-8")
    written = sorted((report.parquet / "minutes").glob("day=*/*.parquet"))
    assert written
    assert stat.S_IMODE(written[0].stat().st_mode) == 0o644  # Hadoop's default, umask 022
    assert stat.S_IMODE(written[0].parent.stat().st_mode) == 0o755
    mine = tmp_path / "mine"
    mine.write_text("x", encoding="utf-8")
    files.setPermission(jvm.org.apache.hadoop.fs.Path(str(mine)),
                        jvm.org.apache.hadoop.fs.permission.FsPermission(0o640))
    assert stat.S_IMODE(mine.stat().st_mode) == 0o640  # by the system call
    assert str(mine) not in chmod_calls.read_text(encoding="utf-8")


def test_the_reports_session_captures_no_python_call_sites(
        spark: SparkSession, report: ReportResult) -> None:
    """PySpark's DataFrame debugging (a py4j round trip or five per column function, about
    half a small run's calls) is off in the report's session, as PySpark reads it: once, at
    the process's first DataFrame call (session.start sets it before any)."""
    from pyspark.errors.utils import is_debugging_enabled

    assert report.audit_rows > 0  # the report ran in this process's session
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert is_debugging_enabled() is False
