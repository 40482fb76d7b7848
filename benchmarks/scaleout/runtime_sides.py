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
from benchmarks.throughput import deploy, load_backlog
from endpoint_runtime.embedded import with_database
from endpoint_runtime.messages import OutgoingMessage
from endpoint_runtime.outgoing import create_outgoing
from endpoint_runtime.transport import QueueAddress, sending

POLL_S = 0.01
COUNT_ROWS = "SELECT count(*) FROM scaleout_sink"


def job_messages(count: int, body_bytes: int, clock: DatabaseClock) -> list[OutgoingMessage]:
    """``count`` messages sharing one random body, stamped with the database's time now."""
    body = random_body(body_bytes).decode()
    sent_at = clock.now()
    return [create_outgoing(Job(key, sent_at, body), originating_endpoint="scaleout")
            for key in range(count)]


async def wait_for_rows(pool: asyncpg.Pool, expected: int, limit_s: float) -> float:
    """Poll the sink until it holds ``expected`` rows; the time it did (perf_counter)."""
    deadline = time.perf_counter() + limit_s
    while True:
        if await pool.fetchval(COUNT_ROWS) >= expected:
            return time.perf_counter()
        if time.perf_counter() > deadline:
            count = await pool.fetchval(COUNT_ROWS)
            raise TimeoutError(f"sink holds {count} of {expected} rows after {limit_s:.0f} s")
        await asyncio.sleep(POLL_S)


@dataclass
class RuntimeSide:
    """One transaction mode of this runtime (a :class:`~benchmarks.scaleout.side.Side`).

    Args:
        name: The side's name in the results, e.g. ``"runtime_batched_50"``.
        endpoint: The endpoint's ``module:attribute`` path in :mod:`.endpoints`.
        overrides: Setting overrides of the deployment (``batch_size``...).
    """

    name: str
    endpoint: str
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, **self.overrides}

    async def drain(self, dsn: str, load: Load) -> DrainResult:
        """Deploy, make the backlog visible in one commit, time until the sink is full."""
        async with throwaway_database(dsn, prefix="er_scaleout_rt") as database:
            database_dsn = with_database(dsn, database)
            pool = await asyncpg.create_pool(database_dsn, min_size=2, max_size=2)
            try:
                await pool.execute(CREATE_SINK)
                async with pool.acquire() as connection:
                    clock = await DatabaseClock.measure(connection)
                messages = job_messages(load.messages, load.body_bytes, clock)
                deployment = await deploy(self.endpoint, database_dsn, load.concurrency,
                                          **self.overrides)
                try:
                    queue = QueueAddress(deployment.config.endpoint_name)
                    visible = await load_backlog(pool, queue, messages)
                    done = await wait_for_rows(pool, load.messages, 60 + load.messages / 50)
                finally:
                    await deployment.stop()
                row = await pool.fetchrow(COUNT_SINK)
            finally:
                await pool.close()
        handled = int(row["distinct_jobs"])
        return DrainResult(self.name, self.config, load, done - visible, handled,
                           int(row["total"]) - handled)

    async def open_loop(self, dsn: str, load: Load, rate_per_s: float,
                        seconds: float) -> LatencyResult:
        """Send one message at a time at ``rate_per_s`` to the running deployment (the peers'
        open-loop sender), then read each message's latencies from its sink row."""
        async with throwaway_database(dsn, prefix="er_scaleout_rt") as database:
            database_dsn = with_database(dsn, database)
            pool = await asyncpg.create_pool(database_dsn, min_size=2,
                                             max_size=SENDS_IN_FLIGHT + 1)
            try:
                await pool.execute(CREATE_SINK)
                async with pool.acquire() as connection:
                    clock = await DatabaseClock.measure(connection)
                deployment = await deploy(self.endpoint, database_dsn, load.concurrency,
                                          **self.overrides)
                try:
                    queue = QueueAddress(deployment.config.endpoint_name)

                    async def enqueue(jobs: list[SinkJob]) -> None:
                        messages = [create_outgoing(Job(job.key, job.sent_at, job.body.decode()),
                                                    originating_endpoint="scaleout")
                                    for job in jobs]
                        async with pool.acquire() as connection:
                            await sending.send_many(connection, queue, messages)

                    sent = await send_at_rate(enqueue, clock, load.body_bytes, rate_per_s,
                                              seconds)
                    await wait_for_rows(pool, sent, SETTLE_S)
                finally:
                    await deployment.stop()
                rows = await pool.fetch(LATENCIES)
                handled = int(await pool.fetchval("SELECT count(DISTINCT job_key) "
                                                  "FROM scaleout_sink"))
            finally:
                await pool.close()
        return LatencyResult(self.name, self.config, rate_per_s, sent, handled,
                             summarize_latency([r["to_start_ms"] for r in rows]),
                             summarize_latency([r["to_done_ms"] for r in rows]))


def runtime_sides(batch_sizes: tuple[int, ...] = (10, 50, 200),
                  include: tuple[str, ...] = ("single", "batched", "receive_only",
                                              "outbox")) -> list[RuntimeSide]:
    """The runtime's modes as sides: single-message atomic, batched atomic per batch size,
    receive-only and the outbox."""
    base = "benchmarks.scaleout.endpoints"
    sides: list[RuntimeSide] = []
    if "single" in include:
        sides.append(RuntimeSide("runtime_single", f"{base}:atomic"))
    if "batched" in include:
        sides += [RuntimeSide(f"runtime_batched_{size}", f"{base}:atomic",
                              {"batch_size": size}) for size in batch_sizes]
    if "receive_only" in include:
        sides.append(RuntimeSide("runtime_receive_only", f"{base}:receive_only"))
    if "outbox" in include:
        sides.append(RuntimeSide("runtime_outbox", f"{base}:outbox"))
    return sides
