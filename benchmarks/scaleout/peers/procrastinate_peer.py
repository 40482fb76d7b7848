"""procrastinate (PyPI) as a side of the scale-out benchmark, through its public API.

Setup: ``App.schema_manager.apply_schema_async()`` in the run's fresh database, through the
connector procrastinate ships for asyncio (``PsycopgConnector``: psycopg 3 and its pool).
Jobs are deferred with ``batch_defer_async`` (one statement per call); workers are
``App.run_worker_async`` tasks in the benchmark's process, stopped by cancelling them (which
procrastinate turns into a graceful stop). The task inserts the sink row on a pool of
``Load.concurrency`` asyncpg connections, the same sink work as every side.

What procrastinate's dequeue does differently from this runtime's (disclosed in the results):

- a fetch is one call of ``procrastinate_fetch_job_v2`` (an UPDATE of one job to ``doing``,
  one commit), made by one fetch loop per worker: jobs are fetched one at a time, whatever
  the worker's ``concurrency``;
- completion is a second call, ``procrastinate_finish_job_v1``, committed per job: an UPDATE
  to ``succeeded`` that keeps the row (``delete_jobs="never"``, the default) or a DELETE;
  triggers on ``procrastinate_jobs`` insert a ``procrastinate_events`` row per status change
  and NOTIFY on each insert; workers register and send heartbeats in ``procrastinate_workers``;
- the task's sink insert commits on its own, before the job's completion commits (at least
  once); the job's arguments are JSON, so the body travels as a JSON string.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import procrastinate

from benchmarks.scaleout.peers.base import SENDS_IN_FLIGHT, PeerSide
from benchmarks.scaleout.peers.sink import Sink, SinkJob
from benchmarks.scaleout.side import Load

TASK = "scaleout_sink"
QUEUE = "scaleout"

logging.getLogger("procrastinate").setLevel(logging.WARNING)


@dataclass(frozen=True)
class ProcrastinateConfig:
    """What a procrastinate configuration sets; ``None`` keeps procrastinate's default."""

    workers: int = 1  # run_worker_async tasks sharing the app's pool
    concurrency: int | None = None  # jobs at once per worker; None: the load's concurrency
    pool_size: int | None = None  # None: psycopg_pool's default (4 connections)
    fetch_job_polling_interval: float | None = None  # None: 5 s
    delete_jobs: str | None = None  # None: "never" (finished jobs stay, status succeeded)

    def worker_options(self, load: Load) -> dict[str, Any]:
        """The keyword arguments of ``run_worker_async`` for ``load``."""
        options: dict[str, Any] = {
            "queues": [QUEUE],
            "concurrency": self.concurrency or load.concurrency,
            "install_signal_handlers": False,
            "wait": True,
        }
        if self.fetch_job_polling_interval is not None:
            options["fetch_job_polling_interval"] = self.fetch_job_polling_interval
        if self.delete_jobs is not None:
            options["delete_jobs"] = self.delete_jobs
        return options


def connector(dsn: str, pool_size: int | None) -> procrastinate.PsycopgConnector:
    """procrastinate's psycopg connector on ``dsn`` (a pool of ``pool_size`` if given)."""
    sizes: dict[str, Any] = {}
    if pool_size is not None:
        sizes = {"min_size": pool_size, "max_size": pool_size}
    return procrastinate.PsycopgConnector(conninfo=dsn, **sizes)


class ProcrastinateRun:
    """procrastinate opened on one database: a sending app, and workers started on demand."""

    def __init__(self, dsn: str, config: ProcrastinateConfig, load: Load,
                 sender: procrastinate.App) -> None:
        self.dsn = dsn
        self.config = config
        self.load = load
        self.deferrer = sender.configure_task(TASK, queue=QUEUE)

    async def enqueue(self, jobs: list[SinkJob]) -> None:
        arguments: list[dict[str, Any]] = [
            {"key": job.key, "sent_at": job.sent_at, "body": job.body.decode("ascii")}
            for job in jobs]
        await self.deferrer.batch_defer_async(*arguments)

    @asynccontextmanager
    async def working(self, sink: Sink) -> AsyncIterator[None]:
        app = procrastinate.App(connector=connector(self.dsn, self.config.pool_size))

        @app.task(name=TASK, queue=QUEUE)
        async def handle(key: int, sent_at: float, body: str) -> None:
            await sink.handle(SinkJob(key, sent_at, body.encode("ascii")))

        async with app.open_async():
            options = self.config.worker_options(self.load)
            workers = [asyncio.create_task(app.run_worker_async(
                name=f"scaleout-{index}", **options)) for index in range(self.config.workers)]
            sink.watch(workers)
            try:
                yield
            finally:
                for worker in workers:
                    worker.cancel()
                for worker in workers:
                    with contextlib.suppress(asyncio.CancelledError):
                        await worker


class ProcrastinateSide(PeerSide):
    """procrastinate in one configuration (see the module docstring for what it does per job)."""

    library = "procrastinate"
    settings: ProcrastinateConfig

    @asynccontextmanager
    async def opened(self, dsn: str, load: Load) -> AsyncIterator[ProcrastinateRun]:
        sender = procrastinate.App(connector=connector(dsn, SENDS_IN_FLIGHT))
        async with sender.open_async():
            await sender.schema_manager.apply_schema_async()
            yield ProcrastinateRun(dsn, self.settings, load, sender)
