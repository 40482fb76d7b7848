"""Endpoints behind PgBouncer in transaction mode against the same endpoints on direct
connections, and the raw-PostgreSQL loop.

A PgBouncer of the run's own (``benchmarks.chaos.pooler``, Debian's package) sits in front of
the server with ``--pool-size`` server connections per database. Each run alternates, on a
fresh database and a backlog of ``--messages`` messages (the scale-out benchmark's ``Job``:
one sink row per message, in the receive transaction):

- ``lean_direct``: the leanest asyncpg loop (receive, insert, commit) on ``--pool-size``
  direct connections: the raw-PostgreSQL baseline;
- ``lean_pooled_asyncpg``: the same loop on as many connections through the pooler, with
  asyncpg's statement cache off as its docs ask for PgBouncer (two round trips a statement);
- ``lean_pooled``: the same through the pooler on the runtime's connection class, which keeps
  each statement's description (one round trip a statement, as the runtime's pools behind a
  pooler): what the pooler leaves of the baseline;
- ``runtime_direct``: the atomic endpoint deployed on Ray with ``--pool-size`` slots on
  direct connections (its receivers' pools and LISTEN connections go to the server);
- ``runtime_pooled``: the same endpoint with ``--slots`` slots (``--receivers`` receivers)
  whose pools connect through the pooler (``TransportSettings.pooler_dsn``); the server
  connections the pooler holds are counted while it drains (its process's sockets, sampled).

Then, per layout, ``--wakeups`` single messages go to the idle deployment (each once the queue
is marked waiting again), and the send-to-handler-start latency of each is read from its sink
row (database clock): ``runtime_direct`` wakes on its receivers' NOTIFY, ``runtime_pooled``
on its peeker's, fanned out to the receivers through Ray.

The last line of stdout is JSON: medians and every run, the ratios (pooled against direct and
against the lean loop) and the wake-up percentiles.

    python -m benchmarks.pooler --dsn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg
import psutil

from benchmarks.chaos.pooler import Pooler
from benchmarks.common import median, progress, run_benchmark, throwaway_database
from benchmarks.scaleout.limits import LeanLoopSide, counted, prepare
from benchmarks.scaleout.peers.sink import (
    COUNT_SINK,
    CREATE_SINK,
    LATENCIES,
    DatabaseClock,
    summarize_latency,
)
from benchmarks.scaleout.runtime_sides import ATOMIC, job_messages, wait_for_rows
from benchmarks.scaleout.side import Load
from benchmarks.throughput import load_backlog
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn, with_database
from endpoint_runtime.runtime.actors.cluster import ensure_ray
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress, sending
from endpoint_runtime.transport.connection import QueueConnection, keep_no_statements
from endpoint_runtime.transport.waiting import Waiting

LAYOUTS = ("lean_direct", "lean_pooled_asyncpg", "lean_pooled", "runtime_direct",
           "runtime_pooled")
SAMPLE_S = 0.05
WAKE_TIMEOUT_S = 30.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pooler", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="the server (default: the embedded PostgreSQL)")
    parser.add_argument("--messages", type=int, default=20_000, help="per drain")
    parser.add_argument("--slots", type=int, default=200, help="receive slots, pooled")
    parser.add_argument("--receivers", type=int, default=4, help="receivers, pooled")
    parser.add_argument("--pool-size", type=int, default=12,
                        help="the pooler's server connections; the direct sides' slots")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per layout")
    parser.add_argument("--wakeups", type=int, default=50, help="idle wake-ups per layout")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="the runtime sides' messages per transaction (> 1: batched "
                        "atomic, optimistic); the lean loops stay one per transaction")
    parser.add_argument("--quick", action="store_true",
                        help="1 run of 4,000 messages, 10 wake-ups; result not kept")
    return parser.parse_args(argv)


def pooler_server_connections(pooler: Pooler) -> int:
    """The server connections the pooler's process holds now (its sockets to the server:
    TCP to the server's port, or Unix sockets for a server on one), observed, not configured."""
    process = psutil.Process(pooler.pid)
    if pooler.server_port is not None:
        return sum(1 for c in process.net_connections(kind="tcp")
                   if c.raddr and c.raddr.port == pooler.server_port)
    return sum(1 for c in process.net_connections(kind="unix") if c.raddr)


class Runtime:
    """The atomic endpoint deployed on a fresh database, direct or through the pooler."""

    def __init__(self, dsn: str, pooler: Pooler | None, slots: int, receivers: int,
                 batch_size: int = 1) -> None:
        self.dsn = dsn
        self.batch_size = batch_size
        self.pooler = pooler
        self.slots = slots
        self.receivers = receivers

    async def drain(self, messages: int, wakeups: int) -> dict[str, Any]:
        async with throwaway_database(self.dsn, prefix="er_pooler_bench") as database:
            database_dsn = with_database(self.dsn, database)
            pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=2)
            try:
                await pool.execute(CREATE_SINK)
                async with pool.acquire() as connection:
                    clock = await DatabaseClock.measure(connection)
                pooler_dsn = self.pooler.for_dsn(database_dsn) if self.pooler else None
                deployment = await EndpointDeployment.start(
                    ATOMIC, transport=TransportSettings(dsn=database_dsn, pooler_dsn=pooler_dsn),
                    max_concurrency=self.slots,
                    slots_per_receiver=-(-self.slots // self.receivers),
                    min_receivers=self.receivers,
                    **({"batch_size": self.batch_size} if self.batch_size > 1 else {}))
                try:
                    return await self._measure(pool, deployment, clock, messages, wakeups)
                finally:
                    await deployment.stop()
            finally:
                await pool.close()

    def _pooler_cpu(self) -> float:
        if self.pooler is None:
            return 0.0
        times = psutil.Process(self.pooler.pid).cpu_times()
        return float(times.user + times.system)

    async def _measure(self, pool: asyncpg.Pool, deployment: EndpointDeployment,
                       clock: DatabaseClock, messages: int, wakeups: int) -> dict[str, Any]:
        queue = QueueAddress(deployment.config.endpoint_name)
        waiting = Waiting(queue)
        await _wait_until(lambda: waiting.is_waiting(pool), "the idle deployment's mark")
        seen: list[int] = []

        async def watch() -> None:
            while self.pooler is not None:
                seen.append(pooler_server_connections(self.pooler))
                await asyncio.sleep(SAMPLE_S)

        watcher = asyncio.get_running_loop().create_task(watch())
        pooler_cpu = self._pooler_cpu()
        try:
            visible = await load_backlog(pool, queue, job_messages(messages, 100, clock))
            done = await wait_for_rows(pool, messages, 120 + messages / 50)
        finally:
            watcher.cancel()
        pooler_cpu = self._pooler_cpu() - pooler_cpu
        row = await pool.fetchrow(COUNT_SINK)
        figures: dict[str, Any] = {
            "msgs_per_s": round(messages / (done - visible), 1),
            "handled": int(row["distinct_jobs"]),
            "duplicates": int(row["total"]) - int(row["distinct_jobs"]),
        }
        if seen:
            figures["server_connections_max"] = max(seen)
            # The pooler's own CPU (user + system) per message, the backlog's load included.
            figures["pooler_cpu_us_per_message"] = round(pooler_cpu / messages * 1e6, 1)
        await pool.execute("TRUNCATE scaleout_sink")
        for key in range(wakeups):
            await _wait_until(lambda: waiting.is_waiting(pool), "the mark after a wake-up")
            async with pool.acquire() as connection:
                await sending.send(connection, queue,
                                   job_messages(1, 100, clock)[0])
            await wait_for_rows(pool, key + 1, WAKE_TIMEOUT_S)
        if wakeups:
            rows = await pool.fetch(LATENCIES)
            figures["wakeup_ms"] = summarize_latency([r["to_start_ms"] for r in rows])
        return figures


async def lean_pooled(dsn: str, pooler: Pooler, messages: int, connections: int, *,
                      described: bool) -> dict[str, Any]:
    """The lean loop of ``lean_direct`` with its connections through the pooler;
    ``described``: on :class:`QueueConnection`, which keeps each statement's description."""
    options: dict[str, Any] = {"statement_cache_size": 0}
    if described:
        options["connection_class"] = QueueConnection
    load = Load(messages=messages, concurrency=connections)
    lean = LeanLoopSide("lean_pooled")
    async with throwaway_database(dsn, prefix="er_pooler_lean") as database:
        database_dsn = with_database(dsn, database)
        pool = await prepare(database_dsn, load)
        opened = [await asyncpg.connect(pooler.for_dsn(database_dsn), **options)
                  for _ in range(connections)]
        for connection in opened:
            keep_no_statements(connection)
        try:
            started = time.perf_counter()
            await asyncio.gather(*(lean.drain_connection(c) for c in opened))
            seconds = time.perf_counter() - started
            handled, duplicates = await counted(pool)
        finally:
            await asyncio.gather(*(c.close() for c in opened))
            await pool.close()
    return {"msgs_per_s": round(handled / seconds, 1), "handled": handled,
            "duplicates": duplicates}


async def _wait_until(condition: Any, what: str, timeout: float = WAKE_TIMEOUT_S) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen within {timeout:.0f} s")
        await asyncio.sleep(0.01)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    dsn = resolve_dsn(args.dsn)
    runs, messages, wakeups = ((1, 4_000, 10) if args.quick
                               else (args.runs, args.messages, args.wakeups))
    ensure_ray()
    pooler = Pooler.start(dsn, pool_size=args.pool_size,
                          max_client_conn=max(2_000, 4 * args.slots + 100))
    measured: dict[str, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
    try:
        sides = {
            "runtime_direct": Runtime(dsn, None, args.pool_size, max(1, args.pool_size // 4),
                                      args.batch_size),
            "runtime_pooled": Runtime(dsn, pooler, args.slots, args.receivers, args.batch_size),
        }
        for run in range(1, runs + 1):
            for layout in LAYOUTS:
                if layout == "lean_direct":
                    result = await LeanLoopSide("lean_direct").drain(
                        dsn, Load(messages=messages, concurrency=args.pool_size))
                    figures: dict[str, Any] = {"msgs_per_s": round(result.msgs_per_s, 1),
                                               "handled": result.handled,
                                               "duplicates": result.duplicates}
                elif layout.startswith("lean_pooled"):
                    figures = await lean_pooled(dsn, pooler, messages, args.pool_size,
                                                described=layout == "lean_pooled")
                else:
                    figures = await sides[layout].drain(messages, wakeups)
                measured[layout].append(figures)
                progress(f"[pooler] run {run}/{runs} {layout:<15} "
                         f"{figures['msgs_per_s']:>9,.0f} msgs/s "
                         f"{figures.get('server_connections_max', '')}")
    finally:
        pooler.stop()
    rates = {layout: median([r["msgs_per_s"] for r in results])
             for layout, results in measured.items()}
    wakeup = {layout: {q: median([r["wakeup_ms"][q] for r in results if "wakeup_ms" in r])
                       for q in ("p50", "p99")}
              for layout, results in measured.items()
              if layout.startswith("runtime") and wakeups}
    pooled = measured["runtime_pooled"]
    return {
        "benchmark": "pooler",
        "dsn": redact_dsn(dsn),
        "messages_per_drain": messages,
        "runtime_batch_size": args.batch_size,
        "pooled_slots": args.slots,
        "pooled_receivers": args.receivers,
        "pooler_pool_size": args.pool_size,
        "direct_slots": args.pool_size,
        "msgs_per_s_median": rates,
        "runs": measured,
        "pooled_vs_direct": round(rates["runtime_pooled"] / rates["runtime_direct"], 3),
        "pooled_vs_lean_direct": round(rates["runtime_pooled"] / rates["lean_direct"], 3),
        "direct_vs_lean_direct": round(rates["runtime_direct"] / rates["lean_direct"], 3),
        "lean_pooled_vs_lean_direct": round(rates["lean_pooled"] / rates["lean_direct"], 3),
        "pooled_vs_lean_pooled": round(rates["runtime_pooled"] / rates["lean_pooled"], 3),
        "lean_pooled_asyncpg_vs_lean_direct": round(rates["lean_pooled_asyncpg"]
                                                    / rates["lean_direct"], 3),
        "pooled_server_connections_max": max(r.get("server_connections_max", 0)
                                             for r in pooled),
        "pooler_cpu_us_per_message_median": median([r["pooler_cpu_us_per_message"]
                                                    for r in pooled]),
        "wakeup_ms_median": wakeup,
        "all_handled_once": all(r["handled"] == messages and r["duplicates"] == 0
                                for results in measured.values() for r in results),
    }


if __name__ == "__main__":
    run_benchmark("pooler", parse, main)
