"""``endpoint-runtime run``: a graceful stop on SIGINT or SIGTERM (the message in flight
finishes, exit status 0), the status line, and a second signal that ends the process at once.

The first tests call the command in this process (as ``tests/e2e/test_outage.py`` does) and
signal this process; the second-signal tests run it as a subprocess, connected to this test
session's Ray, because a second signal ends the whole process. The endpoint is
``tests/support/waking_endpoints.py:napping``: its handler sleeps in the database, where the
tests see it in flight.

The last tests run the command as a person does: several endpoints and ``--ingest`` in one
process on the local Ray it starts itself, Ctrl-C to its process group as a terminal sends it
(the exit within 8 s, none of the processes it started left), and a grace period that cancels a
handler still running (its message rolled back, free to be received again).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray

from endpoint_runtime import TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.cli.common import EXIT_INTERRUPTED, EXIT_OK
from endpoint_runtime.connections.connecting import PostgresTransport
from tests.e2e.conftest import count, queue_exists, wait_for
from tests.support.cli import quiet_logging, run_cli, run_logs
from tests.support.run_endpoints import Note
from tests.support.user_home import family, kill, still_running
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
    # A line when something changed, never the same figures twice in a row (idle polls).
    figures = [tuple(e[f] for f in sorted(STATUS_FIELDS - {"per_second", "receivers_by_node"}))
               for e in status_lines]
    assert all(a != b for a, b in itertools.pairwise(figures)), figures
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


async def _read_events(stream: asyncio.StreamReader, events: list[dict[str, Any]],
                       other: list[str] | None = None) -> None:
    """JSON log lines of the subprocess (its stderr is no terminal) into ``events``; the other
    lines into ``other``, when given."""
    while line := await stream.readline():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            events.append(event)
        elif other is not None:
            other.append(line.decode(errors="replace").rstrip())


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


# -- as a person runs it: its own local Ray, Ctrl-C to its process group -----------------------

EXIT_WITHIN = 8.0
"""Seconds from Ctrl-C to the end of ``run`` when no handler is busy (issue 27): about a second
on a quiet machine; 8 s leaves room for a loaded one (3.8 s seen beside the other worker's
tests) and still fails the code before the fix (15.7 s)."""
LEFTOVERS_WITHIN = 3.0
"""Seconds after ``run`` exited within which the processes it started must be gone (a killed
process may take a moment to be reaped)."""
STATUS_INTERVAL = 0.3
IDLE_POLLS = 5
"""Status polls watched while nothing changes: none may repeat the previous line."""
RUN_ENDPOINTS = ("tests.support.run_endpoints:orders", "tests.support.run_endpoints:shipping")
FIGURES = sorted(STATUS_FIELDS - {"per_second", "receivers_by_node"})


@dataclasses.dataclass
class RunProcess:
    """``endpoint-runtime run`` in a session of its own (as a terminal starts it)."""

    process: asyncio.subprocess.Process
    events: list[dict[str, Any]]
    other: list[str]
    reader: asyncio.Task[None]

    @classmethod
    async def start(cls, dsn: str, *args: str, own_ray: bool) -> RunProcess:
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("ENDPOINT_RUNTIME_") and name != "RAY_ADDRESS"}
        env.update(ENDPOINT_RUNTIME_DSN=dsn, ENDPOINT_RUNTIME_LOG_FORMAT="json")
        if not own_ray:
            env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "endpoint_runtime.cli", "run", *args, cwd=ROOT, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert process.stderr is not None
        events: list[dict[str, Any]] = []
        other: list[str] = []
        return cls(process, events, other,
                   asyncio.create_task(_read_events(process.stderr, events, other)))

    async def until(
        self,
        condition: Callable[[], Awaitable[bool]],
        *,
        timeout: float,  # noqa: ASYNC109 - a polling deadline, as wait_for's
        what: str,
    ) -> None:
        """Wait for ``condition``; fail at once, with its last lines, if ``run`` ended."""
        async def met() -> bool:
            if self.process.returncode is not None:
                raise AssertionError(f"run exited ({self.process.returncode}) before {what}: "
                                     f"{self.other[-5:]} {self.events[-3:]}")
            return await condition()

        try:
            await wait_for(met, timeout=timeout, what=what)
        except AssertionError as exc:
            if self.process.returncode is not None:
                raise
            tail = [str(e.get("event")) for e in self.events[-10:]]
            raise AssertionError(f"{exc}; run's last lines: {self.other[-10:]} {tail}") from None

    def started(self) -> set[str]:
        return {str(e["endpoint"]) for e in self.events if e.get("event") == "endpoint_started"}

    def status_lines(self, endpoint: str) -> list[tuple[Any, ...]]:
        return [tuple(e[f] for f in FIGURES) for e in self.events
                if e.get("event") == "endpoint_status" and e["endpoint"] == endpoint]

    async def ctrl_c(self) -> float:
        """SIGINT to the process group, as a terminal's Ctrl-C; seconds until ``run`` ended."""
        signalled = time.monotonic()
        os.killpg(self.process.pid, signal.SIGINT)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), timeout=60)
        return time.monotonic() - signalled

    async def close(self, *also: psutil.Process) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        kill(set(also) | family(self.process.pid))
        await self.reader


async def _is(expected: int, counted: Awaitable[int]) -> bool:
    return await counted == expected


async def test_run_deploys_several_endpoints_and_ingestion_on_one_ray_and_ctrl_c_ends_it(
    database_dsn: str,
) -> None:
    """`run A B --ingest`: three deployments in one process, on the one local Ray it started
    (one GCS server, one raylet among its processes); both endpoints handle a message and the
    ingestion endpoint records both audit copies. While nothing changes, no status line
    repeats the previous one. Ctrl-C, no handler busy: exit status 0 within 8 s, and none of
    the processes it started (GCS, raylet, Ray's agents, actors) still running 3 s later.
    Before: `run` took one endpoint, logged the same line every interval, and Ctrl-C took
    13-17 s and left Ray's agents running for minutes."""
    await _prepare(database_dsn)
    run = await RunProcess.start(database_dsn, *RUN_ENDPOINTS, "--ingest",
                                 "--status-interval", str(STATUS_INTERVAL), own_ray=True)
    started: set[psutil.Process] = set()
    try:
        async def all_started() -> bool:
            return run.started() >= {"run_orders", "run_shipping", "audit"}

        await run.until(all_started, timeout=240, what="the three deployments to start")
        names = [p.name() for p in family(run.process.pid)]
        assert names.count("gcs_server") == 1, names
        assert names.count("raylet") == 1, names
        async with connected(database_dsn) as db:
            for queue, key in (("run_orders", "o-1"), ("run_shipping", "s-1")):
                await db.send(queue, create_outgoing(Note(key), originating_endpoint="driver"))
            await run.until(lambda: _is(2, count(db.pool, "SELECT count(*) FROM handled")),
                            timeout=60, what="both messages handled")
            await run.until(lambda: _is(2, count(db.pool, "SELECT count(*) FROM audit_log")),
                            timeout=60, what="both audit copies ingested")

        async def counted_by_status_lines() -> bool:
            last = {e["endpoint"]: e["processed"] for e in run.events
                    if e.get("event") == "endpoint_status"}
            return last == {"run_orders": 1, "run_shipping": 1, "audit": 2}

        await run.until(counted_by_status_lines, timeout=60, what="status lines with the counts")
        # A window, not a wait for an event: what is checked is that idle polls log nothing.
        await asyncio.sleep(IDLE_POLLS * STATUS_INTERVAL)
        for endpoint in ("run_orders", "run_shipping", "audit"):
            lines = run.status_lines(endpoint)
            assert all(a != b for a, b in itertools.pairwise(lines)), (endpoint, lines)

        started = family(run.process.pid)
        seconds = await run.ctrl_c()
        assert run.process.returncode == EXIT_OK, (run.process.returncode, run.other[-5:])
        assert seconds < EXIT_WITHIN, f"run exited {seconds:.1f} s after Ctrl-C"

        async def nothing_left() -> bool:
            return not still_running(started)

        with contextlib.suppress(AssertionError):
            await wait_for(nothing_left, timeout=LEFTOVERS_WITHIN, what="its processes to end")
        assert not still_running(started)
    finally:
        await run.close(*started)
    finals = {e["endpoint"]: e["processed"] for e in run.events
              if e.get("event") == "endpoint_final_status"}
    # What the run said at its stop, when a final line is missing (seen once in CI).
    said_at_stop = [e for e in run.events if e.get("event") not in ("endpoint_status",)][-12:]
    assert finals == {"run_orders": 1, "run_shipping": 1, "audit": 2}, (said_at_stop,
                                                                      run.other[-12:])


async def test_a_handler_running_past_the_grace_period_is_cancelled_and_its_message_kept(
    database_dsn: str,
) -> None:
    """`run --stop-timeout 1` with a handler in flight for a minute: Ctrl-C cancels it after
    the one-second grace period (not the minute), `run` exits with status 0, the handler's
    backend no longer runs, and the message is back in the queue, unlocked: the next
    receive gets it."""
    await _prepare(database_dsn)
    run = await RunProcess.start(database_dsn, ENDPOINT, "--stop-timeout", "1", own_ray=False)
    try:
        await run.until(lambda: queue_exists(database_dsn, "napping"), timeout=90,
                        what="the queue")
        await _send(database_dsn, Nap("slow", 60))
        await run.until(lambda: _napping_in_the_database(database_dsn), timeout=60,
                        what="the handler in flight")
        seconds = await run.ctrl_c()
        assert run.process.returncode == EXIT_OK, (run.process.returncode, run.other[-5:])
        # The grace period, the stop and Ray calls on a loaded machine; far from the minute.
        assert seconds < 20, f"run exited {seconds:.1f} s after Ctrl-C"
    finally:
        await run.close()
    async with connected(database_dsn) as db:
        assert not await _napping_in_the_database(database_dsn)
        # Rolled back: the row is there and no transaction holds it.
        free = await count(db.pool, "SELECT count(*) FROM (SELECT 1 FROM napping "
                                    "FOR UPDATE SKIP LOCKED) AS free")
        assert free == 1
    assert not await _handled(database_dsn, "slow")
    final = next(e for e in run.events if e.get("event") == "endpoint_final_status")
    assert final["processed"] == 0
