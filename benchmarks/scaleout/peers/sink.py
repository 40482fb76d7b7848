"""The work every peer does per job, and how a peer's run is checked and timed.

A job carries its key, its send time and a body (:class:`SinkJob`). The peer's handler inserts
one row into ``scaleout_sink`` with the job's key, send time, the handler's start time and the
body; ``done_at`` is ``clock_timestamp()`` of that insert. All times are on the database's
clock: the benchmark process measures its offset to ``clock_timestamp()`` once
(:class:`DatabaseClock`) and converts its own readings.

The peers' handlers run in the benchmark's process, so :class:`Sink` also knows, without
polling the database, when every job's row has committed (an autocommit insert has committed
when it returns): the drain's clock stops there, and a count over the table after the workers
stopped gives the distinct jobs handled and the duplicates.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec

from benchmarks.common import percentile

CREATE_SINK = """
CREATE TABLE scaleout_sink (
    job_key bigint NOT NULL,
    sent_at double precision NOT NULL,
    started_at double precision NOT NULL,
    done_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    body bytea NOT NULL
)"""
INSERT_SINK = (
    "INSERT INTO scaleout_sink (job_key, sent_at, started_at, body) VALUES ($1, $2, $3, $4)"
)
COUNT_SINK = "SELECT count(*) AS total, count(DISTINCT job_key) AS distinct_jobs FROM scaleout_sink"
LATENCIES = """
SELECT (started_at - sent_at) * 1000 AS to_start_ms,
       (extract(epoch FROM done_at)::float8 - sent_at) * 1000 AS to_done_ms
FROM scaleout_sink"""
PERCENTILES = (50.0, 95.0, 99.0)


class SinkJob(msgspec.Struct, array_like=True, frozen=True):
    """What a job carries: its key, its send time (database clock, epoch s) and its body."""

    key: int
    sent_at: float
    body: bytes


def random_body(size: int) -> bytes:
    """``size`` bytes of base64 text from random bytes: ASCII (a JSON string for the peers
    that take JSON) that PostgreSQL's compression of large values cannot shrink, so a 10 KB
    body costs 10 KB on every side."""
    return base64.b64encode(os.urandom(size))[:size]


@dataclass(frozen=True)
class DatabaseClock:
    """This process's clock shifted onto the database server's ``clock_timestamp()``."""

    offset: float

    @classmethod
    async def measure(cls, connection: asyncpg.Connection, samples: int = 7) -> DatabaseClock:
        """The offset from the fastest of ``samples`` round trips (the least uncertain)."""
        best: tuple[float, float] | None = None
        for _ in range(samples):
            before = time.time()
            server = await connection.fetchval(
                "SELECT extract(epoch FROM clock_timestamp())::float8")
            after = time.time()
            if best is None or after - before < best[0]:
                best = (after - before, server - (before + after) / 2)
        assert best is not None
        return cls(best[1])

    def now(self) -> float:
        """The database's time now, in epoch seconds."""
        return time.time() + self.offset


class Sink:
    """The handler's work (one insert on a pool of ``concurrency`` connections) and the
    in-process record of which jobs have been handled."""

    def __init__(self, pool: asyncpg.Pool, clock: DatabaseClock) -> None:
        self.pool = pool
        self.clock = clock
        self.keys: set[int] = set()
        self.expected: int | None = None
        self.filled = asyncio.Event()
        self.error: BaseException | None = None

    @classmethod
    async def open(cls, dsn: str, concurrency: int) -> Sink:
        """Create the sink table and the handlers' pool (connections opened before timing)."""
        pool = await asyncpg.create_pool(dsn, min_size=concurrency, max_size=concurrency)
        try:
            await pool.execute(CREATE_SINK)
            async with pool.acquire() as connection:
                clock = await DatabaseClock.measure(connection)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, clock)

    async def close(self) -> None:
        await self.pool.close()

    async def handle(self, job: SinkJob) -> None:
        """The business effect of one job: one row, committed on return (autocommit)."""
        started = self.clock.now()
        await self.pool.execute(INSERT_SINK, job.key, job.sent_at, started, job.body)
        self.keys.add(job.key)
        self._check()

    def expect(self, count: int) -> None:
        """From now on, ``filled`` is set once ``count`` distinct jobs have been handled."""
        self.expected = count
        self._check()

    def _check(self) -> None:
        if self.expected is not None and len(self.keys) >= self.expected:
            self.filled.set()

    def watch(self, workers: list[asyncio.Task[None]]) -> None:
        """Stop waiting at once if a worker ends with an error (instead of at the timeout)."""
        for worker in workers:
            worker.add_done_callback(self._worker_ended)

    def _worker_ended(self, worker: asyncio.Task[None]) -> None:
        if not worker.cancelled() and worker.exception() is not None:
            self.error = worker.exception()
            self.filled.set()

    async def wait_filled(self, timeout_s: float) -> bool:
        """Wait until every expected job is handled; False when ``timeout_s`` ran out first.

        Raises:
            RuntimeError: A worker failed (its exception is the cause).
        """
        try:
            await asyncio.wait_for(self.filled.wait(), timeout_s)
        except TimeoutError:
            return False
        if self.error is not None:
            raise RuntimeError("a worker of the side failed") from self.error
        return True

    async def verify(self) -> tuple[int, int]:
        """Distinct jobs in the sink table, and rows beyond one per job (read once the
        workers have stopped)."""
        row = await self.pool.fetchrow(COUNT_SINK)
        return int(row["distinct_jobs"]), int(row["total"] - row["distinct_jobs"])

    async def latencies(self) -> tuple[dict[str, float], dict[str, float]]:
        """Percentiles of send-to-handler-start and send-to-completion, in milliseconds."""
        rows = await self.pool.fetch(LATENCIES)
        return (summarize_latency([r["to_start_ms"] for r in rows]),
                summarize_latency([r["to_done_ms"] for r in rows]))


def summarize_latency(values: list[float]) -> dict[str, float]:
    """p50, p95 and p99 of ``values`` (empty when there are none), rounded to 0.01 ms."""
    if not values:
        return {}
    return {f"p{q:.0f}": round(percentile(values, q), 2) for q in PERCENTILES}


def chunks(jobs: list[SinkJob], max_bytes: int = 8 << 20,
           max_jobs: int = 5_000) -> list[list[SinkJob]]:
    """Split a backlog into enqueue calls of at most ``max_jobs`` jobs and about
    ``max_bytes`` of bodies each (one statement and one commit per call)."""
    if not jobs:
        return []
    per_call = max(1, min(max_jobs, max_bytes // max(1, len(jobs[0].body))))
    return [jobs[start:start + per_call] for start in range(0, len(jobs), per_call)]


def backlog(count: int, body_bytes: int, clock: DatabaseClock) -> list[SinkJob]:
    """``count`` jobs sharing one random body, stamped with the database's time now."""
    body = random_body(body_bytes)
    sent_at = clock.now()
    return [SinkJob(key, sent_at, body) for key in range(count)]


def describe(config: dict[str, Any]) -> str:
    """A configuration as ``key=value`` pairs, for progress lines."""
    return " ".join(f"{key}={value}" for key, value in config.items())
