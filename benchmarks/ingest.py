"""Ingestion against the runtime's batched mode and a plain asyncpg loop, in the same run.

Per run, three sides drain a backlog of N messages at the same concurrency, alternating:

- ``ingest``: the ingestion endpoint (``endpoint_runtime.ingestion``) turns N audit copies
  (messages with their processing headers, as endpoints write them) into ``audit_log`` rows,
  500 per transaction; its time runs until ``audit_log`` holds N new rows.
- ``batched``: the runtime's batched atomic mode (50 per commit) drains N messages, sending one
  message each to a sink queue (the throughput benchmark's ``batched`` side).
- ``raw``: the throughput benchmark's plain asyncpg loop (receive, send, commit per message).

The target: ingestion stores audit rows at no less than 0.8x the batched mode's rate.
Run ``python -m benchmarks.ingest --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from benchmarks.common import median, progress, run_benchmark, throwaway_database
from benchmarks.endpoints import Work, ingestion
from benchmarks.throughput import (
    INPUT,
    SINK_ADDRESS,
    deploy,
    load_backlog,
    run_deployed,
    run_raw,
)
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn, with_database
from endpoint_runtime.transport import QueueAddress, queues
from endpoint_runtime.wire.messages import Headers, OutgoingMessage, to_wire_time

QUICK = {"messages": 5_000, "concurrency": 4, "runs": 3}
FULL = {"messages": 20_000, "concurrency": 4, "runs": 5}
AUDIT = QueueAddress("bench_audit")
LAST_AUDIT_ID = ("SELECT coalesce(pg_sequence_last_value("
                 "pg_get_serial_sequence('public.audit_log', 'id')), 0)")
POLL_SECONDS = 0.01


def audit_copies(count: int) -> list[OutgoingMessage]:
    """Audit copies as an endpoint writes them: the message with its processing headers."""
    ended = datetime.now(UTC)
    headers = {
        Headers.PROCESSING_STARTED: to_wire_time(ended - timedelta(milliseconds=2)),
        Headers.PROCESSING_ENDED: to_wire_time(ended),
        Headers.PROCESSING_ENDPOINT: "bench_batched",
        Headers.PROCESSING_MACHINE: platform.node(),
    }
    return [create_outgoing(Work(i, time.time()), originating_endpoint="bench",
                            headers=headers) for i in range(count)]


async def run_ingest(pool: asyncpg.Pool, count: int) -> float:
    await pool.execute(f"VACUUM {AUDIT.qualified}")
    await pool.execute("TRUNCATE audit_log")
    baseline = await pool.fetchval(LAST_AUDIT_ID)
    visible = await load_backlog(pool, AUDIT, audit_copies(count))
    deadline = time.perf_counter() + 600
    while await pool.fetchval(LAST_AUDIT_ID) - baseline < count or \
            await pool.fetchval("SELECT count(*) FROM audit_log") < count:
        if time.perf_counter() > deadline:
            raise TimeoutError("audit_log did not fill within 600 s")
        await asyncio.sleep(POLL_SECONDS)
    return count / (time.perf_counter() - visible)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    sides = ("ingest", "batched", "raw")
    results: dict[str, list[float]] = {side: [] for side in sides}
    async with throwaway_database(server, "er_ingest") as database:
        dsn = with_database(server, database)
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
        try:
            for queue in (INPUT, SINK_ADDRESS, QueueAddress("bench_batched"), AUDIT,
                          QueueAddress("bench_error")):
                async with pool.acquire() as connection:
                    await queues.create_queue(connection, queue,
                                              notify_on_send=queue != SINK_ADDRESS)
            async with pool.acquire() as connection:
                await ingestion.data.setup(connection)
            version = await pool.fetchval("SHOW server_version")
            progress("starting deployments (Ray)...")
            batched = await deploy("benchmarks.endpoints:batched", dsn, args.concurrency,
                                   batch_size=50)
            ingesting = await deploy("benchmarks.endpoints:ingestion", dsn, args.concurrency)

            async def run_side(side: str, messages: int) -> float:
                if side == "ingest":
                    return await run_ingest(pool, messages)
                if side == "batched":
                    return await run_deployed(pool, batched, QueueAddress("bench_batched"),
                                              messages)
                return await run_raw(pool, dsn, messages, args.concurrency)

            try:
                for side in sides:
                    rate = await run_side(side, min(args.messages, 1_000))
                    progress(f"warm-up {side:8s} {rate:9.0f} msg/s (not counted)")
                for run in range(args.runs):
                    for side in sides if run % 2 == 0 else tuple(reversed(sides)):
                        rate = await run_side(side, args.messages)
                        results[side].append(rate)
                        progress(f"run {run + 1}/{args.runs} {side:8s} {rate:9.0f} msg/s")
            finally:
                await batched.stop()
                await ingesting.stop()
        finally:
            await pool.close()
    ingest, batch, raw = (median(results[side]) for side in sides)
    return {
        "benchmark": "ingest",
        "ingest_rows_per_s": round(ingest, 1),
        "batched_msgs_per_s": round(batch, 1),
        "raw_msgs_per_s": round(raw, 1),
        "ingest_to_batched_ratio": round(ingest / batch, 3),
        "ingest_to_batched_ratio_paired_median": round(median(
            [i / b for i, b in zip(results["ingest"], results["batched"], strict=True)]), 3),
        "ingest_to_raw_ratio": round(ingest / raw, 3),
        "target_ingest_to_batched": 0.8,
        "runs": args.runs,
        "messages": args.messages,
        "concurrency": args.concurrency,
        "per_run": {k: [round(v, 1) for v in vs] for k, vs in results.items()},
        "postgres": version,
        "server": redact_dsn(server),
        "python": platform.python_version(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ingest",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run for smoke checks")
    parser.add_argument("--messages", type=int, help="backlog size per run and side")
    parser.add_argument("--concurrency", type=int, help="batches/messages in flight per side")
    parser.add_argument("--runs", type=int, help="runs per side (medians are reported)")
    parser.add_argument("--dsn", help="PostgreSQL server (default: ENDPOINT_RUNTIME_DSN/embedded)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def run(argv: list[str] | None = None) -> None:
    run_benchmark("ingest", parse_args, main, argv)


if __name__ == "__main__":
    run()
