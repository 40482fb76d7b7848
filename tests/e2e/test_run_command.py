"""``endpoint-runtime run``: a graceful stop on SIGINT or SIGTERM (the message in flight
finishes, exit status 0), the status line, and a second signal that ends the process at once.

The first tests call the command in this process (as ``tests/e2e/test_outage.py`` does) and
signal this process; the second-signal tests run it as a subprocess, connected to this test
session's Ray, because a second signal ends the whole process. The endpoint is
``tests/support/waking_endpoints.py:napping``: its handler sleeps in the database, where the
tests see it in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import ray

from endpoint_runtime import TransportSettings
from endpoint_runtime.cli.common import EXIT_INTERRUPTED, EXIT_OK
from endpoint_runtime.connecting import PostgresTransport
from endpoint_runtime.outgoing import create_outgoing
from tests.e2e.conftest import count, queue_exists, wait_for
from tests.support.cli import quiet_logging, run_cli, run_logs
from tests.support.waking_endpoints import Nap

pytestmark = pytest.mark.ray
ENDPOINT = "tests.support.waking_endpoints:napping"
ROOT = Path(__file__).resolve().parents[2]
STATUS_FIELDS = {"endpoint", "depth", "estimate", "receivers", "receivers_by_node", "in_flight",
                 "max_concurrency", "processed", "failed", "per_second"}


@contextlib.asynccontextmanager
async def connected(dsn: str) -> AsyncIterator[PostgresTransport]:
    async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
        yield transport
async def _napping_in_the_database(dsn: str) -> bool:
    async with connected(dsn) as db:
        return await count(db.pool, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND query LIKE 'SELECT pg_sleep%'") == 1


async def _handled(dsn: str, key: str) -> bool:
    async with connected(dsn) as db:
        return await count(db.pool, "SELECT count(*) FROM handled WHERE key = $1", key) == 1


async def _send(dsn: str, message: Nap) -> None:
    async with connected(dsn) as db:
        await db.send("napping", create_outgoing(message, originating_endpoint="driver"))


async def _prepare(dsn: str) -> None:
    async with connected(dsn) as db:
        await db.pool.execute("CREATE TABLE handled (key text)")


def _environment(monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    for name in list(os.environ):
        if name.startswith("ENDPOINT_RUNTIME_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", dsn)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_run_gracefully_with_status_0_and_status_lines(
    database_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    signum: signal.Signals,
) -> None:
    """One message handled (a status line counts it), a second in flight for 3 s when the
    signal comes: `run` says it stops, waits for that message, and exits with status 0."""
    _environment(monkeypatch, database_dsn)
    quiet_logging(monkeypatch)
    asyncio.run(_prepare(database_dsn))
    signalled: list[float] = []
    failures: list[BaseException] = []

    def drive() -> None:
        async def go() -> None:
            await wait_for(lambda: queue_exists(database_dsn, "napping"), timeout=60,
                           what="the queue")
            await _send(database_dsn, Nap("quick", 0))
            await wait_for(lambda: _handled(database_dsn, "quick"), timeout=60,
                           what="'quick' handled")
            await wait_for(lambda: _counted_by_a_status_line(logs), timeout=30,
                           what="a status line counting 'quick'")
            await _send(database_dsn, Nap("in-flight", 3))
            await wait_for(lambda: _napping_in_the_database(database_dsn), timeout=60,
                           what="the handler in flight")
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signum)

        try:
            asyncio.run(go())
        except BaseException as exc:
            failures.append(exc)
            os.kill(os.getpid(), signal.SIGINT)  # ends `run`; the failure is raised below

    driver = threading.Thread(target=drive, daemon=True)
    with run_logs(monkeypatch) as logs:
        driver.start()
        outcome = run_cli(capsys, "run", ENDPOINT, "--status-interval", "0.3")
    driver.join(timeout=30)
    if failures:
        raise failures[0]

    events = [e["event"] for e in logs]
    assert outcome.code == EXIT_OK, (outcome, events[-10:])
    assert asyncio.run(_handled(database_dsn, "in-flight"))  # the stop waited for it
    stop = next(e for e in logs if e["event"] == "stop_requested")
    assert stop["signal"] == signum.name
    status_lines = [e for e in logs if e["event"] == "endpoint_status"]
    assert status_lines
    assert all(e.keys() >= STATUS_FIELDS for e in status_lines)
    assert any(e["processed"] >= 1 and e["depth"] == 0 for e in status_lines)
    final = next(e for e in logs if e["event"] == "endpoint_final_status")
    assert final["processed"] == 2
    assert events.index("stop_requested") < events.index("endpoint_final_status")
    assert not [e for e in logs if e["log_level"] in ("error", "critical")], logs[-5:]


async def _counted_by_a_status_line(logs: list[dict[str, Any]]) -> bool:
    return any(e["event"] == "endpoint_status" and e["processed"] >= 1 for e in list(logs))


def _napping_peekers() -> list[str]:
    return [str(a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)
            if str(a["name"]).startswith("peeker-napping-")]


async def _read_events(stream: asyncio.StreamReader, events: list[dict[str, Any]]) -> None:
    """JSON log lines of the subprocess (its stderr is no terminal) into ``events``."""
    while line := await stream.readline():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                events.append(event)


@pytest.mark.parametrize(("signum", "status"),
                         [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, -signal.SIGTERM)],
                         ids=["SIGINT", "SIGTERM"])
async def test_a_second_signal_ends_run_at_once(
    database_dsn: str, signum: signal.Signals, status: int
) -> None:
    """A handler in flight for a minute: the first signal starts the graceful stop, which
    would wait for it (stop_timeout 120 s); the second ends the process at once (SIGINT:
    status 130; SIGTERM: killed by the signal). The message rolls back, still queued."""
    await _prepare(database_dsn)
    env = {**os.environ, "ENDPOINT_RUNTIME_DSN": database_dsn,
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
           "ENDPOINT_RUNTIME_LOG_FORMAT": "json"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "endpoint_runtime.cli", "run", ENDPOINT, "--status-interval",
        "0.5", cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    events: list[dict[str, Any]] = []
    reader = asyncio.create_task(_read_events(process.stderr, events))
    try:
        await wait_for(lambda: queue_exists(database_dsn, "napping"), timeout=90, what="the queue")
        await _send(database_dsn, Nap("stuck", 60))
        await wait_for(lambda: _napping_in_the_database(database_dsn), timeout=60,
                       what="the handler in flight")
        process.send_signal(signum)

        async def stop_requested() -> bool:
            return any(e.get("event") == "stop_requested" for e in events)

        await wait_for(stop_requested, timeout=30, what="the stop to be requested")
        assert _napping_peekers()  # in this session's Ray, where the test can see it go
        assert process.returncode is None  # the first signal stops gracefully: it waits
        second = time.monotonic()
        process.send_signal(signum)
        # At once: well under the minute the handler still needs (20 s: a loaded machine).
        assert await asyncio.wait_for(process.wait(), timeout=20) == status
        assert time.monotonic() - second < 20
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await reader

    # The process's actors end with it. Its handler's backend sleeps on (PostgreSQL notices
    # a vanished client only at its next read): end it, and the transaction rolls back.
    async def actors_gone() -> bool:
        return not _napping_peekers()

    await wait_for(actors_gone, timeout=60, what="the process's actors to end")
    async with connected(database_dsn) as db:
        await db.pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND query LIKE 'SELECT pg_sleep%'")
        await wait_for(lambda: db.depth("napping"), timeout=30, what="the message queued again")
    assert not await _handled(database_dsn, "stuck")
