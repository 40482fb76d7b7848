"""pgqueuer (PyPI) as a side of the scale-out benchmark, through its public API.

Setup: ``Queries.install()`` in the run's fresh database, with pgqueuer's default durability
(``durable``: every table logged; the server's ``synchronous_commit`` applies to every commit).

Workers are ``PgQueuer`` instances in the benchmark's process, as pgqueuer's own benchmark
tool runs them (``tools/benchmark.py``: one instance per "dequeue" task, each on its own
asyncpg connection behind pgqueuer's ``AsyncpgDriver``, ``run(batch_size=...)``); the job's
handler decodes the payload and inserts the sink row on a pool of ``Load.concurrency``
connections (the same sink work and the same number of connections doing it as every side).

What pgqueuer's dequeue does differently from this runtime's (disclosed in the results):

- a dequeue is an UPDATE of up to ``batch_size`` rows to status ``picked`` (one commit), not a
  DELETE; the job stays in ``pgqueuer`` while it runs;
- completion is buffered: a flush per ``batch_size`` finished jobs (or every 0.1 s) DELETEs
  them from ``pgqueuer`` and INSERTs one ``pgqueuer_log`` row per job (one commit per flush);
  heartbeats are batched UPDATEs; a statement-level trigger on ``pgqueuer`` NOTIFYs;
- the handler's sink insert commits on its own, before the job's completion commits: a crash
  between the two runs the job again (at least once); the runtime's atomic modes commit the
  receive and the handler's work as one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
import msgspec
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Job, PgQueuer, Queries

from benchmarks.scaleout.peers.base import SENDS_IN_FLIGHT, PeerSide
from benchmarks.scaleout.peers.sink import Sink, SinkJob
from benchmarks.scaleout.side import Load

ENTRYPOINT = "scaleout_sink"
STOP_TIMEOUT_S = 60.0
WORKER_POOL_SIZE = 4
"""Connections of a worker's pool when ``driver="pool"``: its LISTEN, its dequeues and flushes."""

logging.getLogger("pgqueuer").setLevel(logging.WARNING)


@dataclass(frozen=True)
class PgqueuerConfig:
    """What a pgqueuer configuration sets; the defaults are pgqueuer's own."""

    workers: int = 1  # PgQueuer instances (pgqueuer's benchmark: "--dequeue")
    batch_size: int = 10  # QueueManager.run's default
    max_concurrent_tasks: int | None = None  # None: unlimited, pgqueuer's default
    driver: str = "connection"  # "connection": AsyncpgDriver; "pool": AsyncpgPoolDriver

    def __post_init__(self) -> None:
        if self.driver not in ("connection", "pool"):
            raise ValueError(f"driver must be 'connection' or 'pool', not {self.driver!r}")
        cap = self.max_concurrent_tasks
        if cap is not None and cap < 2 * self.batch_size:
            raise ValueError("pgqueuer needs max_concurrent_tasks >= 2 x batch_size")


class PgqueuerRun:
    """pgqueuer opened on one database: a sending pool, and workers started on demand."""

    def __init__(self, dsn: str, config: PgqueuerConfig, sender: asyncpg.Pool) -> None:
        self.dsn = dsn
        self.config = config
        self.queries = Queries(AsyncpgPoolDriver(sender))

    async def enqueue(self, jobs: list[SinkJob]) -> None:
        count = len(jobs)
        await self.queries.enqueue([ENTRYPOINT] * count,
                                   [msgspec.msgpack.encode(job) for job in jobs], [0] * count)

    @asynccontextmanager
    async def working(self, sink: Sink) -> AsyncIterator[None]:
        decoder = msgspec.msgpack.Decoder(SinkJob)

        async def handle(job: Job) -> None:
            assert job.payload is not None
            await sink.handle(decoder.decode(job.payload))

        resources = [await self._open_driver() for _ in range(self.config.workers)]
        workers = []
        for driver, _ in resources:
            worker = PgQueuer(driver)
            worker.entrypoint(ENTRYPOINT)(handle)
            workers.append(worker)
        runs = [asyncio.create_task(worker.run(
            batch_size=self.config.batch_size,
            max_concurrent_tasks=self.config.max_concurrent_tasks)) for worker in workers]
        sink.watch(runs)
        try:
            yield
        finally:
            for worker in workers:
                worker.shutdown.set()
            await asyncio.wait_for(asyncio.gather(*runs), STOP_TIMEOUT_S)
            for _, closer in resources:
                await closer.close()

    async def _open_driver(self) -> tuple[AsyncpgDriver | AsyncpgPoolDriver,
                                          asyncpg.Connection | asyncpg.Pool]:
        if self.config.driver == "pool":
            pool = await asyncpg.create_pool(self.dsn, min_size=WORKER_POOL_SIZE,
                                             max_size=WORKER_POOL_SIZE)
            return AsyncpgPoolDriver(pool), pool
        connection = await asyncpg.connect(self.dsn)
        return AsyncpgDriver(connection), connection


class PgqueuerSide(PeerSide):
    """pgqueuer in one configuration (see the module docstring for what it does per job)."""

    library = "pgqueuer"
    settings: PgqueuerConfig

    @asynccontextmanager
    async def opened(self, dsn: str, load: Load) -> AsyncIterator[PgqueuerRun]:
        sender = await asyncpg.create_pool(dsn, min_size=1, max_size=SENDS_IN_FLIGHT)
        try:
            await Queries(AsyncpgPoolDriver(sender)).install()
            yield PgqueuerRun(dsn, self.settings, sender)
        finally:
            await sender.close()
