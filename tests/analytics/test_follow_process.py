"""``endpoint-runtime report --follow`` as its own process, on real PostgreSQL and real Spark:
rows ingested while it follows reach the per-minute tables (the streaming query's
micro-batches), and SIGINT (a terminal's Ctrl-C, sent to the whole process group, Spark's JVM
included) or SIGTERM (``kill PID``) stops it cleanly: exit status 0, the report's paths
printed, no process of its group left (the JVM ends with it), nothing staged or unlisted left
in the extract, and the next run completes the streamed days."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from endpoint_runtime.analytics import extract
from tests.analytics.audit_set import error_row, insert
from tests.analytics.test_incremental import day_counts, in_thread, orders, report
from tests.analytics.test_live import START, processed

ROOT = Path(__file__).resolve().parents[2]
TINY = [argument for key, value in (("spark.sql.shuffle.partitions", "1"),
                                    ("spark.sql.adaptive.enabled", "false"),
                                    ("spark.sql.codegen.wholeStage", "false"),
                                    ("spark.sql.codegen.factoryMode", "NO_CODEGEN"),
                                    ("spark.driver.defaultJavaOptions",
                                     "-XX:TieredStopAtLevel=1"))
        for argument in ("--conf", f"{key}={value}")]
"""As the tests' own session (tests/analytics/conftest.py): a few rows are not worth
generating and compiling code for, nor re-planning after each shuffle; the JIT's quick
compiler only (its ``JVM``): this JVM lives under a minute. The process of this test, from
its start to its exit after the micro-batch, took 45/46 s against 63/67 s with both
compilers, alternating on a loaded two-core machine."""
WAIT_S = 180.0
"""Spark's start and the first run in a process of its own, on a machine that may be busy."""


class Following:
    """The ``report --follow`` process, its stderr lines collected as they come."""

    def __init__(self, dsn: str, out: Path) -> None:
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("ENDPOINT_RUNTIME_")}
        env["ENDPOINT_RUNTIME_DSN"] = dsn
        self.process = subprocess.Popen(
            [sys.executable, "-m", "endpoint_runtime.cli", "report", "--follow", "3600",
             "--micro-batch", "0.5", "--out", str(out), *TINY],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)  # its own group: a Ctrl-C reaches it and its JVM only
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not condition():
            assert self.process.poll() is None, (what, self.process.returncode, self.lines)
            assert time.monotonic() < deadline, (what, self.lines[-20:])
            time.sleep(0.3)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def stopped(self) -> tuple[int, str]:
        """Its exit status and standard output, once it has ended (with a timeout)."""
        status = self.process.wait(timeout=WAIT_S)
        self._reader.join(timeout=10)  # stderr to its end
        assert self.process.stdout is not None
        return status, self.process.stdout.read()

    def close(self) -> None:
        """Killed with its group if still running; its pipes closed."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reader.join(timeout=10)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def following(database_dsn: str, tmp_path: Path) -> Iterator[Following]:
    in_thread(insert(database_dsn, orders("a", START, 3)))
    process = Following(database_dsn, tmp_path / "live")
    try:
        yield process
    finally:
        process.close()


def group_ended(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_report_follow_updates_the_minutes_and_stops_cleanly(
        following: Following, spark: SparkSession, database_dsn: str, tmp_path: Path) -> None:
    """Ctrl-C in a terminal: SIGINT to the whole group, the JVM included (SIGTERM goes
    through the same handler: tests/unit/test_report_stopping.py; one process run is enough
    for the suite's time)."""
    stop = "SIGINT to the group"
    out = tmp_path / "live"
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
