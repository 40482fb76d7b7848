"""Incremental runs into one output, on real PostgreSQL and real Spark: a row whose
transaction commits late (held open across a run) is picked up by the next run and its day
recomputed; a conversation across midnight, and one whose first message arrives late, stay
whole in the day they started; a run that stops between its partitions and its horizon is
rerun idempotently; the report of a generated week run day by day equals one run over the
same rows; the nightly command; rows with NULL timestamps. Scenarios that only read what
their runs wrote share them (module fixtures ``history`` and ``nightly``), each on days of
its own: a run over a few rows costs seconds, whatever their number."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pyspark.sql import SparkSession

from endpoint_runtime.analytics import ReportOptions, extract, job, run_report
from endpoint_runtime.analytics.measures import RANK_ERROR
from endpoint_runtime.analytics.result import ReportResult
from endpoint_runtime.cli import main
from endpoint_runtime.ingestion.storage import AUDIT_FIELDS, OperationalData
from tests.analytics.audit_set import audit_row, error_row, insert
from tests.analytics.databases import own_database
from tests.support.cli import quiet_logging

DAY1 = datetime(2026, 3, 2, tzinfo=UTC)
TABLES = ("minutes", "hours", "exceptions", "flow_edges", "conversations")


def report(spark: SparkSession, dsn: str, out: Path) -> ReportResult:
    return run_report(ReportOptions(dsn=dsn, out=out, render=False), spark)


def table(spark: SparkSession, out: Path, name: str) -> list[dict[str, Any]]:
    """A Parquet table as sorted rows, without the binary sketches."""
    frame = spark.read.parquet(str(out / "parquet" / name))
    columns = [c for c in frame.columns if not c.endswith("_sketch")]
    rows = [{key: (str(value) if key == "day" else value)
             for key, value in row.asDict(recursive=True).items()}
            for row in frame.select(*columns).collect()]
    return sorted(rows, key=lambda row: repr(sorted(row.items(), key=lambda kv: kv[0])))


def day_counts(spark: SparkSession, out: Path) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for row in table(spark, out, "minutes"):
        counts[row["day"]] += row["processed"]
    return dict(counts)


def orders(prefix: str, start: datetime, count: int,
           receiver: str = "sales") -> list[tuple[Any, ...]]:
    return [audit_row(f"{prefix}-{i}", "Orders.PlaceOrder", "web", receiver, f"{prefix}-{i}",
                      None, start + timedelta(seconds=i), 5.0, 50.0) for i in range(count)]


# Three scenarios share three runs into one output (``history``): a run over a few rows
# costs seconds, whatever their number. Each has days of its own, ten days apart, that no
# other touches. BEFORE comes first in time on purpose: a run recomputes conversations from
# the rows of the day before its earliest recomputed day on, so only the earliest scenario
# can have a row before that window.
BEFORE, WHOLE, LATE = DAY1, DAY1 + timedelta(days=10), DAY1 + timedelta(days=20)


def within(base: datetime, days: Iterable[str]) -> list[str]:
    """The days among ``days`` that belong to the scenario starting at ``base``."""
    first, last = base.date().isoformat(), (base + timedelta(days=9)).date().isoformat()
    return sorted(day for day in days if first <= day <= last)


def counts_within(base: datetime, counts: dict[str, int]) -> dict[str, int]:
    return {day: counts[day] for day in within(base, counts)}


def started_within(base: datetime, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversations (rows of the table) that started on the scenario's days."""
    days = set(within(base, (row["day"] for row in rows)))
    return [row for row in rows if row["day"] in days]


def before_rows(second: bool) -> list[tuple[Any, ...]]:
    """BEFORE: conversation w has a row on day 1 and one on day 3; the second run brings
    rows of day 3 only, of other conversations."""
    day3 = BEFORE + timedelta(days=2)
    if second:
        return orders("f", day3 + timedelta(hours=5), 3)
    return [audit_row("w-1", "Orders.PlaceOrder", "web", "sales", "w", None,
                      BEFORE + timedelta(hours=10), 5.0, 50.0),
            audit_row("w-2", "Orders.OrderPlaced", "sales", "billing", "w", "w-1",
                      day3 + timedelta(hours=1), 5.0, 50.0),
            *orders("e", day3 + timedelta(hours=2), 2)]


def whole_rows(second: bool) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """WHOLE: ten conversations of day 1, x across midnight, y and z whose first message
    comes with the second run (z's two days before its follow-up)."""
    midnight = WHOLE + timedelta(days=1)
    if second:
        return [audit_row("x-2", "Orders.OrderPlaced", "sales", "billing", "x", "x-1",
                          midnight + timedelta(seconds=20), 5.0, 25.0),
                audit_row("y-1", "Orders.PlaceOrder", "web", "sales", "y", None,
                          midnight - timedelta(minutes=5), 5.0, 50.0),
                audit_row("z-1", "Orders.PlaceOrder", "web", "sales", "z", None,
                          WHOLE + timedelta(hours=13), 5.0, 50.0),
                *orders("d", midnight + timedelta(hours=9), 3)], [
                    error_row(1, "Orders.OrderPlaced", "sales", "billing",
                              midnight + timedelta(minutes=3), "System.TimeoutException",
                              "late", conversation="x")]
    return [*orders("c", WHOLE + timedelta(hours=12), 10),
            audit_row("x-1", "Orders.PlaceOrder", "web", "sales", "x", None,
                      midnight - timedelta(seconds=10), 5.0, 50.0),
            # Conversation y: its follow-up arrives first, its first message a run later.
            audit_row("y-2", "Orders.OrderPlaced", "sales", "billing", "y", "y-1",
                      midnight + timedelta(hours=2), 5.0, 50.0),
            audit_row("z-2", "Orders.OrderPlaced", "sales", "billing", "z", "z-1",
                      midnight + timedelta(days=1, hours=10), 5.0, 50.0)], []


@dataclass
class Tables:
    """An output's tables as a shared run left them (later runs change them)."""

    day_counts: dict[str, int]
    conversations: list[dict[str, Any]]

    @classmethod
    def of(cls, spark: SparkSession, out: Path) -> Tables:
        return cls(day_counts(spark, out), table(spark, out, "conversations"))


@dataclass
class Run:
    """One of the shared runs: its result, and its output's tables after it."""

    result: ReportResult
    tables: Tables


@pytest.fixture(scope="module")
def history(spark: SparkSession, server_dsn: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Run]]:
    """Three incremental runs into one output over the rows of the scenarios BEFORE, WHOLE
    and LATE (the tests below say what each checks):

    1. every scenario's first rows committed; then LATE's late rows written by a
       transaction that stays open, and rows committed by a newer one (not read: the
       horizon stops at the open transaction);
    2. the late transaction committed, BEFORE's and WHOLE's second rows added;
    3. nothing new."""
    out = tmp_path_factory.mktemp("history")
    runs: list[Run] = []

    def run(dsn: str) -> None:
        result = report(spark, dsn, out)
        runs.append(Run(result, Tables.of(spark, out)))

    with own_database(server_dsn, "history") as dsn, asyncio.Runner() as runner:
        runner.run(insert(dsn, [*before_rows(False), *whole_rows(False)[0],
                                *orders("a", LATE + timedelta(hours=10), 10, "shipping")]))
        late = runner.run(asyncpg.connect(dsn))
        try:
            transaction = late.transaction()
            runner.run(transaction.start())
            # Written early (lower id, earlier processing end) but committed after the run.
            runner.run(late.copy_records_to_table("audit_log", records=orders(
                "late", LATE + timedelta(hours=10, minutes=1), 3, "shipping"),
                columns=AUDIT_FIELDS))
            # Committed before the run, by a transaction newer than the one still open.
            runner.run(insert(dsn, orders("b", LATE + timedelta(days=1, hours=9), 4,
                                          "shipping"), setup=False))
            run(dsn)
            runner.run(transaction.commit())
        finally:
            runner.run(late.close())
        audit, errors = whole_rows(True)
        runner.run(insert(dsn, [*audit, *before_rows(True)], errors, setup=False))
        run(dsn)
        run(dsn)
        yield runs


def test_a_late_commit_is_read_by_the_next_run_and_its_day_recomputed(
        spark: SparkSession, history: list[Run]) -> None:
    """LATE (endpoint ``shipping``): ten rows read by the first run; three written before it
    but committed after it, and four committed before it by a newer transaction, read by the
    second, which recomputes both days; the third reads nothing and recomputes nothing, and
    its page figures cover every day."""
    first, second, third = history
    assert counts_within(LATE, first.tables.day_counts) == {"2026-03-22": 10}
    assert first.result.audit_rows == 10 + 13 + 4  # LATE's, WHOLE's and BEFORE's
    assert second.result.audit_rows == 7 + 6 + 3
    assert within(LATE, second.result.days) == ["2026-03-22", "2026-03-23"]
    assert counts_within(LATE, second.tables.day_counts) == {"2026-03-22": 13, "2026-03-23": 4}
    assert len(started_within(LATE, second.tables.conversations)) == 17
    assert second.result.horizon is not None
    assert first.result.horizon is not None
    assert second.result.horizon > first.result.horizon
    assert (third.result.audit_rows, third.result.days) == (0, [])
    assert third.tables.day_counts == second.tables.day_counts
    assert counts_within(LATE, third.tables.day_counts) == {"2026-03-22": 13, "2026-03-23": 4}
    job.page_figures(spark, third.result)
    assert sorted(row["processed"] for row in third.result.summary
                  if row["endpoint"] == "shipping") == [17, 17]


def test_conversations_stay_whole_in_the_day_they_started(history: list[Run]) -> None:
    """WHOLE: ten conversations of day 1 and one that starts at 23:59:50 and ends after
    midnight; the nightly pattern used to replace day 1 with the one conversation of the
    next run. Conversations y and z get their first message a run late: z's moves its start
    two days back, to a day whose partition the next run writes anyway, away from a day the
    new rows do not touch (that day must be rewritten without z)."""
    first, second, _ = history
    started = {row["conversation_id"]: row["day"] for row in first.tables.conversations}
    assert (started["y"], started["z"]) == ("2026-03-13", "2026-03-14")
    assert within(WHOLE, second.result.days) == ["2026-03-12", "2026-03-13", "2026-03-14"]
    assert len({row["conversation_id"] for row in second.tables.conversations}) == len(
        second.tables.conversations)  # each once in the whole table
    rows = started_within(WHOLE, second.tables.conversations)
    conversations = {row["conversation_id"]: row for row in rows}
    assert len(rows) == len(conversations) == 16  # c-0..9, x, y, z, d-0..2: each once
    by_day: dict[str, list[str]] = defaultdict(list)
    for name, row in conversations.items():
        by_day[row["day"]].append(name)
    assert sorted(by_day["2026-03-12"]) == sorted([f"c-{i}" for i in range(10)] +
                                                  ["x", "y", "z"])
    assert sorted(by_day["2026-03-13"]) == ["d-0", "d-1", "d-2"]
    x = conversations["x"]
    assert (x["messages"], x["failed"], x["endpoints"]) == (2, 1, ["billing", "sales"])
    assert x["duration_ms"] == pytest.approx(30_050.0)
    y = conversations["y"]
    assert (y["messages"], y["initiating_type"]) == (2, "Orders.PlaceOrder")


def test_a_conversation_with_a_row_before_the_recomputed_days_stays_whole(
        history: list[Run]) -> None:
    """BEFORE: conversation w has a row on day 1 and one on day 3. The second run brings
    rows of day 3 only, of other conversations: day 3's conversations are recomputed from
    the rows of days 2 and 3, where w has a row too; w started before them, so it stays
    whole in day 1 (not also a one-message copy in day 3)."""
    _, second, _ = history
    assert within(BEFORE, second.result.days) == ["2026-03-04"]
    assert min(second.result.days) == "2026-03-04"  # the run's window starts at day 2
    assert len({row["conversation_id"] for row in second.tables.conversations}) == len(
        second.tables.conversations)  # each once in the whole table
    rows = started_within(BEFORE, second.tables.conversations)
    assert sorted(row["conversation_id"] for row in rows) == [
        "e-0", "e-1", "f-0", "f-1", "f-2", "w"]  # each once
    [w] = [row for row in rows if row["conversation_id"] == "w"]
    assert (w["day"], w["messages"]) == ("2026-03-02", 2)


async def test_a_run_stopped_before_its_horizon_is_rerun_idempotently(
        spark: SparkSession, database_dsn: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The run stops after its partitions, before its manifest; one of its days of
    ``conversations`` is left out as by a stop inside ``outputs.publish`` (moved aside, its
    new one not yet in). The rerun must take conversation starts from the rows, not from the
    table: else conversation q (started that day, its follow-up among the new rows) and the
    day are lost."""
    await insert(database_dsn, [
        *orders("a", DAY1 + timedelta(hours=10), 5),
        audit_row("q-1", "Orders.PlaceOrder", "web", "sales", "q", None,
                  DAY1 - timedelta(hours=14), 5.0, 50.0)])
    report(spark, database_dsn, tmp_path)
    await insert(database_dsn, [*orders("b", DAY1 + timedelta(hours=11), 4),
                                *orders("c", DAY1 + timedelta(days=1), 2),
                                audit_row("q-2", "Orders.OrderPlaced", "sales", "billing", "q",
                                          "q-1", DAY1 + timedelta(days=1, hours=9), 5.0, 50.0)])

    class Stopped(Exception):
        pass

    def stopped(root: Path, manifest: extract.Manifest) -> None:
        raise Stopped("stopped between the partitions and the horizon")

    monkeypatch.setattr(extract, "save", stopped)
    with pytest.raises(Stopped):
        report(spark, database_dsn, tmp_path)
    monkeypatch.undo()
    counts = {"2026-03-01": 1, "2026-03-02": 9, "2026-03-03": 3}
    # The partitions of the stopped run are out; its extract files are not listed.
    assert day_counts(spark, tmp_path) == counts
    assert len(list((tmp_path / "extract" / "audit").glob("day=*/*.parquet"))) > len(
        extract.load(tmp_path / "extract").files["audit"])
    aside = tmp_path / "parquet" / "_staging" / "stopped-run" / "old"
    aside.mkdir(parents=True)
    (tmp_path / "parquet" / "conversations" / "day=2026-03-01").rename(
        aside / "day=2026-03-01")
    rerun = report(spark, database_dsn, tmp_path)
    assert rerun.audit_rows == 7
    assert day_counts(spark, tmp_path) == counts
    listed = extract.load(tmp_path / "extract").files["audit"]
    assert sorted(str(p.relative_to(tmp_path / "extract"))
                  for p in (tmp_path / "extract" / "audit").glob("day=*/*.parquet")) == \
        sorted(listed)
    rows = spark.read.parquet(*(str(tmp_path / "extract" / name) for name in listed))
    assert rows.count() == 13 == rows.select("message_id").distinct().count()
    conversations = table(spark, tmp_path, "conversations")
    assert len(conversations) == 12  # a-0..4, b-0..3, c-0..1, q: each once
    [q] = [row for row in conversations if row["conversation_id"] == "q"]
    assert (q["day"], q["messages"]) == ("2026-03-01", 2)
    assert not (tmp_path / "parquet" / "_staging").exists()  # cleared once redone


async def test_after_retention_the_extract_decides_which_conversations_started_before(
        spark: SparkSession, database_dsn: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Until retention runs, a run takes the start days of old conversations from the
    ``conversations`` table; after it, from the extract's rows. Conversation s starts the
    day before the cutoff and is processed just after midnight: retention deletes its start
    day from the table, while the extract keeps its row (a processing day). Its next row
    must not make it look new: from the table alone it would be written into that day, one
    message long."""
    cutoff = DAY1 + timedelta(days=1)  # --keep-days as if run on 2026-03-06
    monkeypatch.setattr(job, "_cutoff", lambda keep_days: cutoff.date().isoformat())
    options = ReportOptions(dsn=database_dsn, out=tmp_path, render=False, keep_days=3)
    first = audit_row("s-1", "Orders.PlaceOrder", "web", "sales", "s", None,
                      cutoff + timedelta(seconds=10), 5.0, 20_000.0)  # sent 23:59:50
    await insert(database_dsn, [first, *orders("k", cutoff + timedelta(days=1, hours=10), 2)])
    run_report(options, spark)
    assert extract.load(tmp_path / "extract").expired_before == "2026-03-03"
    assert "s" not in {row["conversation_id"] for row in table(spark, tmp_path, "conversations")}
    later = cutoff + timedelta(days=2, hours=10)
    await insert(database_dsn, [
        audit_row("s-2", "Orders.OrderPlaced", "sales", "billing", "s", "s-1", later, 5.0,
                  50.0), *orders("m", later, 2)])
    second = run_report(options, spark)
    assert second.audit_rows == 3
    rows = table(spark, tmp_path, "conversations")
    assert sorted(row["conversation_id"] for row in rows) == ["k-0", "k-1", "m-0", "m-1"]


def week(seed: int = 11) -> list[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """A generated week, as the rows ingestion writes on each of its seven days: saga-like
    conversations of one to four messages (many across midnight), failures, retries, and 5%
    of the rows written a day late."""
    rng = random.Random(seed)
    endpoints = ("web", "sales", "billing", "shipping")
    types = ("Orders.PlaceOrder", "Orders.OrderPlaced", "Billing.Billed", "Ship.Shipped")
    batches: list[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]] = [
        ([], []) for _ in range(7)]

    def batch(moment: datetime) -> int:
        index = (moment - DAY1).days + (1 if rng.random() < 0.05 else 0)
        return max(0, min(6, index))

    seq = 0
    for number in range(360):
        conversation = f"w-{number}"
        moment = DAY1 + timedelta(seconds=rng.uniform(0, 6.9 * 86400))
        parent = None
        for step in range(rng.randint(1, 4)):
            critical = rng.uniform(5, 4000)
            processing = critical * rng.uniform(0.05, 0.9)
            ended = moment + timedelta(milliseconds=critical)
            message = f"{conversation}-{step}"
            row = audit_row(message, types[step], endpoints[step], endpoints[step + 1]
                            if step < 3 else "notifications", conversation, parent, ended,
                            processing, critical, rng.choice((0, 0, 0, 1, 2)))
            batches[batch(ended)][0].append(row)
            if rng.random() < 0.08:
                seq += 1
                failed_at = ended + timedelta(seconds=rng.uniform(1, 300))
                batches[batch(failed_at)][1].append(error_row(
                    seq, types[step], endpoints[step], endpoints[min(step + 1, 3)], failed_at,
                    rng.choice(("System.TimeoutException", "Billing.Declined")),
                    f"failed #{seq % 3}\n   at Handler.Handle()", conversation=conversation))
            parent = message
            moment = ended + timedelta(seconds=rng.uniform(0, 4 * 3600))
    return batches


def rank_ok(values: list[float], found: float, p: float) -> bool:
    """``found`` has a rank within the sketch's stated error of ``p`` (nearest rank)."""
    ordered = sorted(values)
    low = sum(v < found for v in ordered) / len(ordered)
    high = sum(v <= found for v in ordered) / len(ordered)
    slack = RANK_ERROR + 1 / len(ordered)
    return low - slack <= p <= high + slack


async def test_a_week_day_by_day_equals_one_run_over_the_same_rows(
        spark: SparkSession, database_dsn: str, tmp_path: Path) -> None:
    nightly, whole = tmp_path / "nightly", tmp_path / "whole"
    batches = week()
    connection = await asyncpg.connect(database_dsn)
    await OperationalData("public").setup(connection)
    await connection.close()
    for audit, errors in batches:
        await insert(database_dsn, audit, errors)
        last = report(spark, database_dsn, nightly)
    full = report(spark, database_dsn, whole)
    assert full.audit_rows == sum(len(audit) for audit, _ in batches)
    for name in TABLES:
        assert table(spark, nightly, name) == table(spark, whole, name), name
    for result in (last, full):  # the page's figures cover every day of each output
        job.page_figures(spark, result)
    assert last.summary == full.summary
    assert last.edges == full.edges
    assert last.slowest == full.slowest
    assert last.exceptions == full.exceptions
    values: dict[str, list[float]] = defaultdict(list)
    for audit, _ in batches:
        for record in audit:
            values[record[5]].append(record[13])  # processing endpoint, critical time
    for total in full.summary:
        if total["message_type"] is None:
            for label, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
                assert rank_ok(values[total["endpoint"]], total[f"critical_ms_{label}"], p)
    assert not math.isnan(full.summary[0]["per_second"])


def in_thread(coroutine: Any) -> None:
    """Run a coroutine to its end from code that may be on an event loop's thread."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coroutine).result()


NULLS = DAY1 + timedelta(days=10)


def null_rows() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Four whole rows and one of each kind with NULL timestamps (endpoint ``shipping``)."""
    rows = orders("ok", NULLS + timedelta(hours=3), 4, "shipping")
    no_end = list(orders("no-end", NULLS, 1, "shipping")[0])
    no_end[11] = None  # processing_ended: in no figure
    no_sent = list(orders("no-sent", NULLS + timedelta(hours=3), 1, "shipping")[0])
    no_sent[9] = no_sent[10] = None  # time_sent, processing_started: counted, no durations
    no_sent[12] = no_sent[13] = None
    failure = list(error_row(1, "Orders.PlaceOrder", "web", "shipping", NULLS, "E", "m"))
    failure[13] = None  # time_of_failure
    return [*rows, tuple(no_end), tuple(no_sent)], [tuple(failure)]


@dataclass
class Command:
    """A run of the command line: its exit status, what it printed, what it wrote."""

    out: Path
    status: int
    printed: str
    summary: dict[str, Any]
    page: str
    tables: Tables


@pytest.fixture(scope="module")
def nightly(spark: SparkSession, server_dsn: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Command]]:
    """The cron line's command (docs/analytics.md, "A schedule") twice into one output,
    around new rows: five orders and ``null_rows``, then three orders. The two tests below
    share its two runs (a run costs seconds, whatever its rows)."""
    out = tmp_path_factory.mktemp("nightly") / "report"
    runs: list[Command] = []
    with own_database(server_dsn, "nightly") as dsn, pytest.MonkeyPatch.context() as patch:
        quiet_logging(patch)  # as the autouse fixture does for a test
        patch.setenv("ENDPOINT_RUNTIME_DSN", dsn)
        audit, errors = null_rows()
        for rows, failed in (([*orders("n", DAY1 + timedelta(hours=1), 5), *audit], errors),
                             (orders("m", DAY1 + timedelta(hours=2), 3), [])):
            in_thread(insert(dsn, rows, failed))
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                status = main(["report", "--out", str(out)])
            runs.append(Command(
                out, status, printed.getvalue(),
                json.loads((out / "summary.json").read_text(encoding="utf-8")),
                (out / "report.html").read_text(encoding="utf-8"), Tables.of(spark, out)))
        yield runs


def test_the_nightly_command(nightly: list[Command]) -> None:
    """The command twice around new rows (the live mode, ``--follow``, is
    tests/analytics/test_live.py): the second reads the three new rows and recomputes their
    day only."""
    first, second = nightly
    assert (first.status, second.status) == (0, 0)
    assert f"summary: {second.out / 'summary.json'}" in second.printed.splitlines()
    assert (second.summary["audit_rows"], second.summary["days"]) == (3, ["2026-03-02"])
    assert second.tables.day_counts == {"2026-03-02": 8, "2026-03-12": 5}  # 5 + 3, and null_rows'


def test_null_timestamps_are_skipped_and_counted(nightly: list[Command]) -> None:
    """``null_rows``, in the first run: rows without a processing end are in no figure,
    those without a send or start time are counted without durations, failures without a
    time are left out; every kind counted in the page and ``summary.json``."""
    first, _ = nightly
    assert first.status == 0
    assert first.summary["null_counts"] == {
        "audit_log.processing_ended": 1, "audit_log.time_sent": 1,
        "audit_log.processing_started": 1, "error_log.time_of_failure": 1}
    assert counts_within(NULLS, first.tables.day_counts) == {"2026-03-12": 5}
    (total,) = [row for row in first.summary["endpoints"]
                if row["endpoint"] == "shipping" and row["message_type"] is None]
    assert (total["processed"], total["failed"], total["critical_ms_p50"]) == (5, 0, 50.0)
    assert len(started_within(NULLS, first.tables.conversations)) == 5
    assert "rows with NULL audit_log.processing_ended" in first.page
