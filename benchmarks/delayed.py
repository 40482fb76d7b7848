"""Delayed delivery lateness: how long after its due time a deferred message is handled.

Messages are deferred through the endpoint's delayed-message store with due times spread over
a window; the endpoint's deployment (peeker with the mover, receivers) dispatches and handles
them, and the handler records ``handler start - due``. The baseline, in the same run, is the
same path without the store: messages sent for immediate delivery, ``handler start - send``.
Run ``python -m benchmarks.delayed --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg

from benchmarks.common import (
    median,
    percentile,
    progress,
    run_benchmark,
    throwaway_database,
)
from benchmarks.endpoints import Timed, delayed_target
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn, with_database
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.runtime.sender import Sender
from endpoint_runtime.settings import TransportSettings

QUEUE = "bench_delayed"


async def wait_for_rows(pool: asyncpg.Pool, expected: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while (rows := await pool.fetchval("SELECT count(*) FROM bench_lateness")) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rows} of {expected} messages handled after {limit_s} s")
        await asyncio.sleep(0.05)


async def lateness(pool: asyncpg.Pool) -> list[float]:
    rows = await pool.fetch("SELECT lateness_ms FROM bench_lateness")
    await pool.execute("TRUNCATE bench_lateness")
    return [float(r["lateness_ms"]) for r in rows]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    async with throwaway_database(server, "er_delayed") as database:
        dsn = with_database(server, database)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        await pool.execute("CREATE TABLE bench_lateness (n integer, lateness_ms float8)")
        settings = TransportSettings(dsn=dsn)
        deployment = await EndpointDeployment.start(
            "benchmarks.endpoints:delayed_target", transport=settings
        )
        # Defers through the endpoint's own delayed-message store, which its deployment moves.
        sender = Sender("bench", settings, delayed_store=delayed_target.delayed_store)
        try:
            progress(f"baseline: {args.messages} immediate sends...")
            for i in range(args.messages):
                await sender.send(Timed(i, time.time()), QUEUE)
                await asyncio.sleep(args.window / args.messages)
            await wait_for_rows(pool, args.messages, 60)
            immediate = await lateness(pool)
            progress(f"delayed: {args.messages} messages due over {args.window} s...")
            start = time.time() + 1.0
            dues = sorted(start + random.uniform(0, args.window) for _ in range(args.messages))
            for i, due in enumerate(dues):
                await sender.send(Timed(i, due), QUEUE,
                                  deliver_at=datetime.fromtimestamp(due, UTC))
            await wait_for_rows(pool, args.messages, args.window + 60)
            delayed = await lateness(pool)
        finally:
            await deployment.stop()
            await sender.close()
            await pool.close()
    return {
        "benchmark": "delayed",
        "messages": args.messages,
        "window_s": args.window,
        "lateness_p50_ms": round(percentile(delayed, 50), 2),
        "lateness_p99_ms": round(percentile(delayed, 99), 2),
        "lateness_max_ms": round(max(delayed), 2),
        "early": sum(1 for value in delayed if value < 0),
        "immediate_p50_ms": round(median(immediate), 2),
        "immediate_p99_ms": round(percentile(immediate, 99), 2),
        "lateness_vs_immediate_p50_ratio": round(percentile(delayed, 50) / median(immediate), 2),
        "server": redact_dsn(server),
        "python": platform.python_version(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.delayed", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="short run")
    parser.add_argument("--messages", type=int, help="messages per phase")
    parser.add_argument("--window", type=float, help="seconds over which due times spread")
    parser.add_argument("--dsn", help="PostgreSQL server (default: ENDPOINT_RUNTIME_DSN/embedded)")
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 100 if args.quick else 500
    if args.window is None:
        args.window = 5.0 if args.quick else 20.0
    return args


def run(argv: list[str] | None = None) -> None:
    run_benchmark("delayed", parse_args, main, argv)


if __name__ == "__main__":
    run()
