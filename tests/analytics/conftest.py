"""One Spark session for every report test (starting one takes 5-10 s), in local mode with
two cores, against the session's PostgreSQL server (the embedded one through its socket)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from endpoint_runtime.analytics import prerequisites, session
from endpoint_runtime.analytics.jdbc import jdbc_target
from tests.analytics import following
from tests.support.cli import quiet_logging

JVM = [("spark.driver.defaultJavaOptions", "-XX:TieredStopAtLevel=1")]
"""The JIT's quick compiler only. The session lives a few minutes, and its start and cold
first run are where the optimising compiler's threads compete with it for the two cores
without paying back: Spark's start 9.0/8.4 s against 17.5/14.5 s, the cold first run
17.9/15.1 s against 25.6/25.3 s, warm runs no slower (medians of the next eight 3.4/3.5 s
against 5.9/3.6 s), alternating on a loaded two-core machine. Measured on warm runs alone
(docs/analytics.md), it had made no difference."""


@pytest.fixture(scope="session")
def chmod_calls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's JVM notes each ``chmod`` process it starts (its PATH leads to a
    ``chmod`` that notes its arguments, then runs the real one)."""
    folder = tmp_path_factory.mktemp("chmod")
    calls = folder / "calls"
    calls.touch()
    script = folder / "chmod"
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {shutil.which("chmod")} "$@"\n',
                      encoding="utf-8")
    script.chmod(0o755)
    return calls


@pytest.fixture(scope="session")
def early_following(request: pytest.FixtureRequest, server_dsn: str,
                    tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[following.Following | None]:
    """The ``report --follow`` process of ``test_follow_process.py`` when the session runs
    that test (else ``None``), started before the shared session (``spark`` asks for it): its
    own JVM's start and first run then overlap the session's start and the tests ahead of it."""
    if not following.selected(request.session):
        yield None
        return
    with following.running(server_dsn, tmp_path_factory.mktemp("follow") / "live") as process:
        yield process


@pytest.fixture(scope="session")
def spark(server_dsn: str, chmod_calls: Path,
          early_following: following.Following | None) -> Iterator[SparkSession]:
    found = prerequisites.check(jdbc_target(server_dsn).unix_socket)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{chmod_calls.parent}{os.pathsep}{path}"  # the JVM's, at its start
    try:
        spark = session.start("local[2]", found, JVM)
    finally:
        os.environ["PATH"] = path
    # The test sets are tiny: fewer shuffle tasks per aggregation keep each run short, and
    # without adaptive execution each query runs as one Spark job (adaptive execution
    # submits every shuffle stage as a job of its own, to re-plan after it: nothing to
    # gain on a few hundred rows, and it about doubles the jobs of a run). The figures do
    # not depend on it.
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    # Nor is code generated and compiled for each query: on a few hundred rows compiling
    # costs more than it saves (Spark's interpreted evaluation, same results).
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
    yield spark
    spark.stop()


@pytest.fixture(autouse=True)
def _process_logging_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report tests call the command line's ``main``, which configures logging once per
    process (warnings only for commands other than ``run``): later tests of the session
    would no longer see info lines. As in the other command-line tests, leave it alone."""
    quiet_logging(monkeypatch)
