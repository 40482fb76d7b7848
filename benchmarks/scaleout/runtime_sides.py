"""This runtime as sides of the scale-out benchmark: an endpoint deployment per drain.

A drain creates a fresh database, the sink table and the endpoint's queues, starts the
deployment (a peeker and its receivers, idle), makes a backlog of ``Load.messages`` visible in
one commit, and times until the sink holds one row per message; then it stops the deployment
and drops the database. The receivers pull the messages from PostgreSQL themselves; only the
deployment's start and stop go through Ray.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from benchmarks.common import throwaway_database
from benchmarks.scaleout.endpoints import Job
from benchmarks.scaleout.peers.base import SENDS_IN_FLIGHT, SETTLE_S, send_at_rate
from benchmarks.scaleout.peers.sink import (
    COUNT_SINK,
    CREATE_SINK,
    LATENCIES,
    DatabaseClock,
    SinkJob,
    random_body,
    summarize_latency,
)
from benchmarks.scaleout.side import DrainResult, LatencyResult, Load
from benchmarks.throughput import load_backlog
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress, sending
from endpoint_runtime.wire.messages import OutgoingMessage

POLL_S = 0.01
ENDPOINTS = "benchmarks.scaleout.endpoints"
ATOMIC = f"{ENDPOINTS}:atomic"
COUNT_ROWS = "SELECT count(*) FROM scaleout_sink"
ERROR_QUEUE = QueueAddress("error").qualified


def job_messages(count: int, body_bytes: int, clock: DatabaseClock) -> list[OutgoingMessage]:
    """``count`` messages sharing one random body, stamped with the database's time now."""
    body = random_body(body_bytes).decode()
    sent_at = clock.now()
    return [create_outgoing(Job(key, sent_at, body), originating_endpoint="scaleout")
            for key in range(count)]


async def wait_for_rows(pool: asyncpg.Pool, expected: int, limit_s: float,
                        count: str = COUNT_ROWS) -> float:
    """Poll the sink until it holds ``expected`` rows (``count``: the query that counts
    them); the time it did (perf_counter)."""
    deadline = time.perf_counter() + limit_s
    while True:
        if await pool.fetchval(count) >= expected:
            return time.perf_counter()
        if time.perf_counter() > deadline:
            held = await pool.fetchval(count)
            raise TimeoutError(f"sink holds {held} of {expected} rows after {limit_s:.0f} s")
        await asyncio.sleep(POLL_S)


@dataclass
class Deployed:
    """A running deployment of one side in its own database, with a pool to check on it."""

    pool: asyncpg.Pool
    deployment: EndpointDeployment
    queue: QueueAddress
    clock: DatabaseClock
    dsn: str  # of the side's own database
    stopped: bool = False

    async def stop(self) -> None:
        """Stop the deployment (once): its receivers finish what they hold and exit."""
        if not self.stopped:
            self.stopped = True
            await self.deployment.stop()

    async def placement(self) -> dict[str, float]:
        """How many receivers ran and on how many Ray nodes (one call per receiver)."""
        status = await self.deployment.status(refresh=True)
        return {"receivers": len(status.receivers),
                "nodes_with_receivers": len(status.receivers_by_node)}

    async def counted(self) -> tuple[int, int]:
        """Distinct messages in the sink and rows beyond one per message."""
        row = await self.pool.fetchrow(COUNT_SINK)
        return int(row["distinct_jobs"]), int(row["total"]) - int(row["distinct_jobs"])

    async def latencies(self) -> tuple[dict[str, float], dict[str, float]]:
        """Send-to-handler-start and send-to-completion percentiles of every sink row, ms."""
        rows = await self.pool.fetch(LATENCIES)
        return (summarize_latency([r["to_start_ms"] for r in rows]),
                summarize_latency([r["to_done_ms"] for r in rows]))


@dataclass
class RuntimeSide:
    """One transaction mode of this runtime (a :class:`~benchmarks.scaleout.side.Side`).

    Args:
        name: The side's name in the results, e.g. ``"runtime_batched_50"``.
        endpoint: The endpoint's ``module:attribute`` path in :mod:`.endpoints`.
        overrides: Setting overrides of the deployment (``batch_size``...).
        transport: Transport setting overrides (``notify_on_send``...).
    """

    name: str
    endpoint: str
    overrides: dict[str, Any] = field(default_factory=dict)
    transport: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, **self.overrides, **self.transport}

    @asynccontextmanager
    async def deployed(self, dsn: str, load: Load, pool_size: int = 2,
                       **overrides: Any) -> AsyncIterator[Deployed]:
        """A fresh database with the sink table and this side's deployment running (idle);
        stopped and dropped on exit. ``overrides`` add to the side's own (receivers...)."""
        async with throwaway_database(dsn, prefix="er_scaleout_rt") as database:
            database_dsn = with_database(dsn, database)
            pool = await asyncpg.create_pool(database_dsn, min_size=2, max_size=pool_size)
            try:
                await pool.execute(CREATE_SINK)
                async with pool.acquire() as connection:
                    clock = await DatabaseClock.measure(connection)
                settings = {"max_concurrency": load.concurrency,
                            "slots_per_receiver": load.concurrency, **self.overrides,
                            **overrides}
                deployment = await EndpointDeployment.start(
                    self.endpoint, transport=TransportSettings(dsn=database_dsn,
                                                               **self.transport), **settings)
                running = Deployed(pool, deployment,
                                   QueueAddress(deployment.config.endpoint_name), clock,
                                   database_dsn)
                try:
                    yield running
                finally:
                    await running.stop()
            finally:
                await pool.close()

    failing: bool = False
    """The endpoint fails one message in a hundred on every attempt: the drain ends when the
    sink holds the others and the error queue those (``handled`` counts both)."""

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        """Deploy, make the backlog visible in one commit, time until the sink is full."""
        async with self.deployed(dsn, load) as running:
            messages = job_messages(load.messages, load.body_bytes, running.clock)
            visible = await load_backlog(running.pool, running.queue, messages)
            count = COUNT_ROWS
            if self.failing:
                count = f"SELECT ({COUNT_ROWS}) + (SELECT count(*) FROM {ERROR_QUEUE})"
            done = await wait_for_rows(running.pool, load.messages, 60 + load.messages / 50,
                                       count)
            figures = await running.placement()
            await running.stop()
            handled, duplicates = await running.counted()
            if self.failing:
                handled += await running.pool.fetchval(f"SELECT count(*) FROM {ERROR_QUEUE}")
        return DrainResult(self.name, self.config, load, done - visible, handled, duplicates,
                           figures)

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        """Send one message at a time at ``rate_per_s`` to the running deployment (the peers'
        open-loop sender), then read each message's latencies from its sink row."""
        async with self.deployed(dsn, load, pool_size=SENDS_IN_FLIGHT + 1) as running:

            async def enqueue(jobs: list[SinkJob]) -> None:
                messages = [create_outgoing(Job(job.key, job.sent_at, job.body.decode()),
                                            originating_endpoint="scaleout") for job in jobs]
                async with running.pool.acquire() as connection:
                    await sending.send_many(connection, running.queue, messages)

            sent = await send_at_rate(enqueue, running.clock, load.body_bytes, rate_per_s,
                                      seconds)
            await wait_for_rows(running.pool, sent, SETTLE_S)
            await running.stop()
            handled, _ = await running.counted()
            to_start, to_done = await running.latencies()
        return LatencyResult(self.name, self.config, rate_per_s, sent, handled, to_start,
                             to_done)


def runtime_sides(batch_sizes: tuple[int, ...] = (10, 50, 200),
                  include: tuple[str, ...] = ("single", "batched", "batched_variants",
                                              "receive_only", "outbox")) -> list[RuntimeSide]:
    """The runtime's modes as sides: single-message atomic, batched atomic per batch size
    (optimistic), batched 50 with a savepoint per message and with 1% of messages failing,
    receive-only and the outbox."""
    sides: list[RuntimeSide] = []
    if "single" in include:
        sides.append(RuntimeSide("runtime_single", ATOMIC))
    if "batched" in include:
        sides += [RuntimeSide(f"runtime_batched_{size}", ATOMIC, {"batch_size": size})
                  for size in batch_sizes]
    if "batched_variants" in include:
        sides += [RuntimeSide("runtime_batched_50_savepoint", ATOMIC,
                              {"batch_size": 50, "batch_isolation": "savepoint"}),
                  RuntimeSide("runtime_batched_50_failing_1pct", f"{ENDPOINTS}:failing",
                              {"batch_size": 50}, failing=True)]
    if "receive_only" in include:
        sides.append(RuntimeSide("runtime_receive_only", f"{ENDPOINTS}:receive_only"))
    if "outbox" in include:
        sides.append(RuntimeSide("runtime_outbox", f"{ENDPOINTS}:outbox"))
    return sides
