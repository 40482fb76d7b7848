"""The ``endpoint-runtime report --follow`` process of ``test_follow_process.py``, started before
the tests' shared Spark session when that test is selected (``early_following`` in this folder's
conftest): the process's JVM start and first run, about 25 s of mostly one core, then overlap
the session's start and the tests before it instead of adding to the suite's time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.analytics.audit_set import insert
from tests.analytics.databases import own_database
from tests.analytics.test_incremental import in_thread, orders
from tests.analytics.test_live import START

TEST_FILE = "test_follow_process.py"
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
        self.dsn, self.out = dsn, out
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


def selected(session: pytest.Session) -> bool:
    """Whether the session runs the ``--follow`` process's test."""
    return any(item.path.name == TEST_FILE for item in session.items)


@contextmanager
def running(server_dsn: str, out: Path) -> Iterator[Following]:
    """The process, following a database of its own that holds three orders of ``START``;
    killed with its group at the end if it still runs."""
    with own_database(server_dsn, "follow") as dsn:
        in_thread(insert(dsn, orders("a", START, 3)))
        process = Following(dsn, out)
        try:
            yield process
        finally:
            process.close()
