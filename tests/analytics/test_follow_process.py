"""``endpoint-runtime report --follow`` as its own process, on real PostgreSQL and real Spark:
rows ingested while it follows reach the per-minute tables (the streaming query's
micro-batches), and SIGINT (a terminal's Ctrl-C, sent to the whole process group, Spark's JVM
included) or SIGTERM (``kill PID``) stops it cleanly: exit status 0, the report's paths
printed, no process of its group left (the JVM ends with it), nothing staged or unlisted left
in the extract, and the next run completes the streamed days.

The process starts with the shared Spark session, before the tests ahead of this one
(``early_following``, tests/analytics/conftest.py; ``tests/analytics/following.py``)."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

from pyspark.sql import SparkSession

from endpoint_runtime.analytics import extract
from tests.analytics.audit_set import error_row, insert
from tests.analytics.following import Following
from tests.analytics.test_incremental import day_counts, in_thread, orders, report
from tests.analytics.test_live import START, processed


def group_ended(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_report_follow_updates_the_minutes_and_stops_cleanly(
        early_following: Following | None, spark: SparkSession) -> None:
    """Ctrl-C in a terminal: SIGINT to the whole group, the JVM included (SIGTERM goes
    through the same handler: tests/unit/test_report_stopping.py; one process run is enough
    for the suite's time)."""
    following = early_following
    assert following is not None, "started by the session when this test is selected"
    stop = "SIGINT to the group"
    out, database_dsn = following.out, following.dsn
    following.wait_for(lambda: following.said("live: following"), "the stream started")
    assert extract.load(out / "extract").horizon is not None
    assert processed(spark, out) == {(START, "sales"): (3, 0)}
    minute = START + timedelta(minutes=5)
    in_thread(insert(database_dsn, orders("b", minute, 4),
                     [error_row(1, "Orders.PlaceOrder", "web", "sales",
                                minute + timedelta(seconds=9), "E", "boom")], setup=False))
    # The line comes once the micro-batch has published its minutes (and polling its log
    # costs no Spark job beside the process's own).
    following.wait_for(lambda: following.said("live: 4 audit rows, 1 failed messages"),
                       "the micro-batch of the new rows")
    assert processed(spark, out)[(minute, "sales")] == (4, 1)
    pgid = following.process.pid
    if stop.startswith("SIGINT"):
        os.killpg(pgid, signal.SIGINT)
    else:
        following.process.send_signal(signal.SIGTERM)
    status, printed = following.stopped()
    name = stop.split()[0]
    assert status == 0, following.lines[-20:]
    assert following.said(f"live: stopped ({name})"), following.lines[-20:]
    assert f"report: {out.resolve() / 'report.html'}" in printed.splitlines()
    deadline = time.monotonic() + 30
    while not group_ended(pgid):  # Spark's JVM ends with the process that started it
        assert time.monotonic() < deadline, "a process of the report's group is left"
        time.sleep(0.2)
    root = out / "extract"
    manifest = extract.load(root)
    assert not [path for path in (root / extract.STAGING).rglob("*") if path.is_file()]
    assert extract.remove_unlisted(root, manifest) == []  # every file on disk is listed
    assert manifest.pending["audit"]  # streamed: their days are redone by the next run
    # The next run (nothing new to read) completes the streamed days in every table.
    after = report(spark, database_dsn, out)
    assert (after.audit_rows, after.days) == (0, [START.date().isoformat()])
    assert day_counts(spark, out) == {START.date().isoformat(): 7}
    assert processed(spark, out)[(minute, "sales")] == (4, 1)
