"""The drain and the open-loop run of a peer, written once for every peer library.

A peer module supplies only :meth:`PeerSide.opened`: install the library's schema in a fresh
database, open its resources, and give back a :class:`PeerRun` that can enqueue jobs and run
the library's workers. Each run gets a database of its own (created before, dropped after with
every session in it), so no run inherits another's dead rows and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict
from typing import Any, Protocol

from benchmarks.common import progress, throwaway_database
from benchmarks.scaleout.peers.sink import (
    DatabaseClock,
    Sink,
    SinkJob,
    backlog,
    chunks,
    random_body,
)
from benchmarks.scaleout.side import DrainResult, LatencyResult, Load
from endpoint_runtime.connections.embedded import with_database

SENDS_IN_FLIGHT = 8
"""Open-loop sends under way at once (each one INSERT and its COMMIT)."""
SETTLE_S = 60.0
"""How long an open-loop run waits, after its last send, for the last jobs to be handled."""


class PeerRun(Protocol):
    """One configuration of a peer library, opened on one database."""

    async def enqueue(self, jobs: list[SinkJob]) -> None:
        """Enqueue ``jobs`` in one statement (one commit)."""
        ...

    def working(self, sink: Sink) -> AbstractAsyncContextManager[None]:
        """Run the library's workers, each job handled by ``sink.handle``; stop them on exit
        (gracefully: jobs in flight finish and are acknowledged)."""
        ...


def drain_timeout_s(load: Load) -> float:
    """The longest a drain may take: a minute plus 20 messages a second."""
    return 60.0 + load.messages / 20.0


class PeerSide(ABC):
    """A :class:`~benchmarks.scaleout.side.Side` for a peer library, in one configuration.

    Args:
        name: The side's name in the results, e.g. ``"pgqueuer_best"``.
        settings: The library's configuration (a dataclass), reported as ``config``.
    """

    library: str

    def __init__(self, name: str, settings: Any) -> None:
        self.name = name
        self.settings = settings
        self.config: dict[str, Any] = {"library": self.library, **asdict(settings)}

    @abstractmethod
    def opened(self, dsn: str, load: Load) -> AbstractAsyncContextManager[PeerRun]:
        """Install the library's tables in the empty database ``dsn`` and open the run."""

    @asynccontextmanager
    async def prepared(self, dsn: str, load: Load) -> AsyncIterator[tuple[PeerRun, Sink]]:
        """A fresh database with the library's schema and the sink, dropped on exit."""
        async with throwaway_database(dsn, "er_scaleout_peer") as database:
            database_dsn = with_database(dsn, database)
            sink = await Sink.open(database_dsn, load.concurrency)
            try:
                async with self.opened(database_dsn, load) as run:
                    yield run, sink
            finally:
                await sink.close()

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        """Enqueue the backlog with no worker running and ANALYZE the database (untimed), then
        time the workers from their start until every job's sink row has committed."""
        async with self.prepared(dsn, load) as (run, sink):
            for part in chunks(backlog(load.messages, load.body_bytes, sink.clock)):
                await run.enqueue(part)
            # Statistics of the full backlog, as autovacuum's ANALYZE gives a production server
            # (the development server runs without autovacuum): without them procrastinate's
            # planner takes the 10,000-row queue for an empty one and sorts every waiting job
            # on each fetch (1.5-3 ms a fetch), and its drain falls from ~400 to ~150 jobs/s.
            await sink.pool.execute("ANALYZE")
            sink.expect(load.messages)
            started = time.perf_counter()
            async with run.working(sink):
                filled = await sink.wait_filled(drain_timeout_s(load))
                seconds = time.perf_counter() - started
            handled, duplicates = await sink.verify()
        if not filled:
            progress(f"{self.name}: {handled} of {load.messages} jobs handled "
                     f"in {seconds:.0f} s (gave up)")
        return DrainResult(self.name, dict(self.config), load, seconds, handled, duplicates)

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        """Send one job at a time at ``rate_per_s`` while the workers run, then read each
        job's latencies from its sink row."""
        async with self.prepared(dsn, load) as (run, sink):
            async with run.working(sink):
                sent = await send_at_rate(run.enqueue, sink.clock, load.body_bytes,
                                          rate_per_s, seconds)
                sink.expect(sent)
                await sink.wait_filled(SETTLE_S)
            handled, _ = await sink.verify()
            to_start, to_done = await sink.latencies()
        return LatencyResult(self.name, dict(self.config), rate_per_s, sent, handled,
                             to_start, to_done)


async def send_at_rate(enqueue: Callable[[list[SinkJob]], Awaitable[None]],
                       clock: DatabaseClock, body_bytes: int, rate_per_s: float,
                       seconds: float) -> int:
    """Send ``rate_per_s * seconds`` jobs, each at its own scheduled moment (open loop: a slow
    side does not slow the arrivals). A job's send time is its scheduled moment, so time
    spent waiting for a free sending connection counts in its latency. Returns the count."""
    body = random_body(body_bytes)
    total = max(1, round(rate_per_s * seconds))
    gate = asyncio.Semaphore(SENDS_IN_FLIGHT)

    async def send(job: SinkJob) -> None:
        async with gate:
            await enqueue([job])

    sends = []
    start = time.perf_counter()
    for key in range(total):
        delay = start + key / rate_per_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sends.append(asyncio.create_task(send(SinkJob(key, clock.now(), body))))
    await asyncio.gather(*sends)
    return total
