"""Throughput of the Ray runtime against a plain asyncpg loop doing the same statements.

Per run, the same backlog of N messages is drained three ways, at the same concurrency:

- ``raw``: C asyncio tasks, each on its own connection: BEGIN; the transport's receive DELETE;
  INSERT of the received row (id, headers, body as they came) into the sink queue with the
  transport's send INSERT; COMMIT. Four round trips, as a plain asyncpg loop makes them.
- ``ours``: an endpoint deployment (peeker + receiver actors) in atomic mode whose handler
  sends one message to the sink queue.
- ``batched``: the same with batched atomic receive (``batch_size`` messages per commit).
- with ``--mode outbox`` also ``atomic_business``, ``outbox`` and ``outbox_sync``: the handler
  inserts one business row and sends one message, in atomic mode and with the outbox
  (receive-only). ``outbox`` commits its acks and dispatches asynchronously (the default:
  ``synchronous_commit = off`` for those transactions; the business transaction and atomic mode
  wait for their WAL flush); ``outbox_sync`` waits for every flush
  (``OutboxSettings(synchronous_acks=True)``), the comparison at equal durability.

Each side first drains one uncounted warm-up backlog (``--warmup``). Before each run the side's
queues are vacuumed; the backlog becomes visible in one commit, and a side's time runs from that
commit until the sink holds N messages. Idle latency (send -> handler start) is measured on the
idle atomic deployment with messages sent one at a time. ``--hold-snapshot`` keeps a
REPEATABLE READ transaction open on another connection while each side runs (a long report or
a backup): the rows a side deletes then stay in the queue's index for every scan.
Run ``python -m benchmarks.throughput --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import time
from collections.abc import AsyncIterator
from contextlib import nullcontext
from typing import Any

import asyncpg
import msgspec
import psutil

from benchmarks.common import (
    median,
    percentile,
    progress,
    run_benchmark,
    throwaway_database,
)
from benchmarks.endpoints import SINK, Echo, Work
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn, with_database
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress, queues, sending, statements
from endpoint_runtime.wire.messages import OutgoingMessage

QUICK = {"messages": 2_000, "concurrency": 4, "runs": 3, "latency_samples": 100}
FULL = {"messages": 10_000, "concurrency": 4, "runs": 5, "latency_samples": 300}
INPUT = QueueAddress("bench_input")
SINK_ADDRESS = QueueAddress(SINK)
POLL_SECONDS = 0.01


def work_messages(count: int) -> list[OutgoingMessage]:
    now = time.time()
    return [create_outgoing(Work(i, now), originating_endpoint="bench") for i in range(count)]


async def load_backlog(
    pool: asyncpg.Pool, queue: QueueAddress, messages: list[OutgoingMessage]
) -> float:
    """Insert the whole backlog in one transaction; returns the time it became visible."""
    async with pool.acquire() as connection, connection.transaction():
        for start in range(0, len(messages), 1000):
            await sending.send_many(connection, queue, messages[start : start + 1000])
    return time.perf_counter()


LAST_SINK_SEQ = "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')), 0)"


async def sink_baseline(pool: asyncpg.Pool) -> int:
    """The sink's last seq before a side starts: rows it then receives have higher ones."""
    last: int = await pool.fetchval(LAST_SINK_SEQ, SINK_ADDRESS.qualified)
    return last


async def wait_for_sink(
    pool: asyncpg.Pool, baseline: int, expected: int, limit_s: float = 600.0
) -> float:
    """Wait until the sink holds ``expected`` rows.

    The poll reads the sink's sequence, not the table: every insert takes the next seq, so the
    sink cannot hold ``expected`` new rows before ``expected`` numbers past the baseline are
    taken. Reading a sequence costs the same at any depth. (An aggregate over the sink, even
    ``max(seq)``, is planned while the freshly vacuumed table is empty: a sequential scan that
    grows with the run and slows the side being measured, and a slow side more than a fast
    one.) Only when enough numbers are taken does an exact count confirm that the inserts
    have committed.
    """
    deadline = time.perf_counter() + limit_s
    while True:
        taken = await pool.fetchval(LAST_SINK_SEQ, SINK_ADDRESS.qualified) - baseline
        if taken >= expected and await queues.depth(pool, SINK_ADDRESS) >= expected:
            return time.perf_counter()
        if time.perf_counter() > deadline:
            count = await queues.depth(pool, SINK_ADDRESS)
            raise TimeoutError(f"sink holds {count} of {expected} messages after {limit_s} s")
        await asyncio.sleep(POLL_SECONDS)


async def reset_queues(pool: asyncpg.Pool, queue: QueueAddress) -> None:
    """Every side starts from the same state: an empty sink, and the dead rows of earlier runs
    vacuumed away (else the receive's index scan wades through as many as autovacuum left,
    which makes runs differ by more than the sides do)."""
    await queues.purge(pool, SINK_ADDRESS)
    await pool.execute(f"VACUUM {queue.qualified}, {SINK_ADDRESS.qualified}")


async def run_raw(pool: asyncpg.Pool, dsn: str, count: int, concurrency: int) -> float:
    """Plain asyncpg: the transport's own receive and send statements, nothing else."""
    await reset_queues(pool, INPUT)
    receive_sql = statements.for_queue(INPUT)["receive"]
    send_sql = statements.for_queue(SINK_ADDRESS)["send"]
    connections = [await asyncpg.connect(dsn) for _ in range(concurrency)]

    async def loop(connection: asyncpg.Connection) -> None:
        # Forwards each row as it came: the sink gets rows of the size the runtime writes
        # (a message with its standard headers), so both sides give PostgreSQL the same work.
        while True:
            async with connection.transaction():
                row = await connection.fetchrow(receive_sql)
                if row is None:
                    return
                await connection.execute(send_sql, row["id"], None, row["headers"], row["body"])

    try:
        baseline = await sink_baseline(pool)
        visible = await load_backlog(pool, INPUT, work_messages(count))
        # Polled while the loops run, exactly as for the deployments.
        sink_filled = asyncio.create_task(wait_for_sink(pool, baseline, count))
        await asyncio.gather(*(loop(c) for c in connections))
        done = await sink_filled
    finally:
        if "sink_filled" in locals() and not sink_filled.done():
            sink_filled.cancel()
        await asyncio.gather(*(c.close() for c in connections))
    return count / (done - visible)


async def run_deployed(
    pool: asyncpg.Pool, deployment: EndpointDeployment, queue: QueueAddress, count: int
) -> float:
    await reset_queues(pool, queue)
    baseline = await sink_baseline(pool)
    visible = await load_backlog(pool, queue, work_messages(count))
    done = await wait_for_sink(pool, baseline, count)
    return count / (done - visible)


async def measure_latency(
    pool: asyncpg.Pool, queue: QueueAddress, samples: int, gap_s: float = 0.02
) -> list[float]:
    """Send one message at a time to an idle endpoint; latency = handler start - send."""
    await queues.purge(pool, SINK_ADDRESS)
    baseline = await sink_baseline(pool)
    for i in range(samples):
        await sending.send(pool, queue, create_outgoing(Work(i, time.time())))
        await asyncio.sleep(gap_s)
    await wait_for_sink(pool, baseline, samples)
    rows = await pool.fetch(f"SELECT body FROM {SINK_ADDRESS.qualified}")
    decoder = msgspec.json.Decoder(Echo)
    return [(e.started_at - e.sent_at) * 1000 for e in (decoder.decode(r["body"]) for r in rows)]


@contextlib.asynccontextmanager
async def held_snapshot(dsn: str) -> AsyncIterator[None]:
    """A transaction that keeps its snapshot while a side runs, as a long report or a backup
    would: no row the side deletes may be vacuumed or skipped by index scans meanwhile."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await connection.fetchval("SELECT count(*) FROM bench_business")
        yield
    finally:
        await connection.close()


async def deploy(path: str, dsn: str, concurrency: int, **overrides: Any) -> EndpointDeployment:
    return await EndpointDeployment.start(
        path,
        transport=TransportSettings(dsn=dsn),
        max_concurrency=concurrency,
        slots_per_receiver=concurrency,
        **overrides,
    )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    sides = ["raw", "ours", "batched"]
    if args.mode == "outbox":
        sides += ["atomic_business", "outbox", "outbox_sync"]
    results: dict[str, list[float]] = {side: [] for side in sides}
    latencies: list[float] = []
    rss_mb: list[float] = []
    async with throwaway_database(server, "er_throughput") as database:
        dsn = with_database(server, database)
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
        try:
            await pool.execute("CREATE TABLE bench_business (n integer)")
            for queue in (INPUT, SINK_ADDRESS, QueueAddress("bench_atomic"),
                          QueueAddress("bench_batched"), QueueAddress("bench_atomic_business"),
                          QueueAddress("bench_outbox"), QueueAddress("bench_outbox_sync")):
                async with pool.acquire() as connection:
                    # The sink is no endpoint's input: nobody listens, so it need not NOTIFY.
                    await queues.create_queue(connection, queue,
                                              notify_on_send=queue != SINK_ADDRESS)
            version = await pool.fetchval("SHOW server_version")
            progress("starting deployments (Ray)...")
            atomic = await deploy("benchmarks.endpoints:atomic", dsn, args.concurrency)
            batched = await deploy("benchmarks.endpoints:batched", dsn, args.concurrency,
                                   batch_size=args.batch_size)
            deployed = {"ours": (atomic, "bench_atomic"), "batched": (batched, "bench_batched")}
            if args.mode == "outbox":
                deployed["atomic_business"] = (
                    await deploy("benchmarks.endpoints:atomic_business", dsn, args.concurrency),
                    "bench_atomic_business",
                )
                deployed["outbox"] = (
                    await deploy("benchmarks.endpoints:outbox_business", dsn, args.concurrency),
                    "bench_outbox",
                )
                deployed["outbox_sync"] = (
                    await deploy("benchmarks.endpoints:outbox_sync_business", dsn,
                                 args.concurrency),
                    "bench_outbox_sync",
                )
            async def run_side(side: str, messages: int) -> float:
                async with held_snapshot(dsn) if args.hold_snapshot else nullcontext():
                    if side == "raw":
                        return await run_raw(pool, dsn, messages, args.concurrency)
                    deployment, queue = deployed[side]
                    return await run_deployed(pool, deployment, QueueAddress(queue), messages)

            try:
                for side in sides if args.warmup else ():
                    rate = await run_side(side, args.warmup)
                    progress(f"warm-up {side:8s} {rate:9.0f} msg/s (not counted)")
                for run in range(args.runs):
                    order = list(sides)
                    if run % 2:
                        order.reverse()
                    for side in order:
                        rate = await run_side(side, args.messages)
                        results[side].append(rate)
                        progress(f"run {run + 1}/{args.runs} {side:8s} {rate:9.0f} msg/s")
                    for pid in await atomic.receiver_pids():
                        rss_mb.append(psutil.Process(pid).memory_info().rss / 2**20)
                progress("idle latency...")
                latencies = await measure_latency(pool, QueueAddress("bench_atomic"),
                                                  args.latency_samples)
            finally:
                for deployment, _ in deployed.values():
                    await deployment.stop()
        finally:
            await pool.close()
    raw, ours, batch = (median(results[k]) for k in ("raw", "ours", "batched"))
    extra: dict[str, Any] = {}
    if args.mode == "outbox":
        business = median(results["atomic_business"])
        for side in ("outbox", "outbox_sync"):
            rate = median(results[side])
            extra[f"{side}_msgs_per_s"] = round(rate, 1)
            extra[f"{side}_ratio"] = round(rate / business, 3)
            extra[f"{side}_ratio_paired_median"] = round(median(
                [o / b for o, b in zip(results[side], results["atomic_business"],
                                       strict=True)]), 3)
        extra["atomic_business_msgs_per_s"] = round(business, 1)
        extra["outbox_commits"] = (
            "outbox: acks and dispatches commit asynchronously (synchronous_commit=off), the "
            "business transaction synchronously; outbox_sync and atomic_business: every "
            "commit waits for its WAL flush")
    paired = sorted(o / r for o, r in zip(results["ours"], results["raw"], strict=True))
    return {
        "benchmark": "throughput",
        "msgs_per_s": round(ours, 1),
        "raw_msgs_per_s": round(raw, 1),
        "ratio": round(ours / raw, 3),
        "ratio_paired_median": round(median(paired), 3),
        "batched_msgs_per_s": round(batch, 1),
        "batched_ratio": round(batch / raw, 3),
        "latency_p50_ms": round(percentile(latencies, 50), 2),
        "latency_p99_ms": round(percentile(latencies, 99), 2),
        "receiver_rss_mb": round(max(rss_mb), 1) if rss_mb else None,
        "runs": args.runs,
        "messages": args.messages,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "warmup_messages": args.warmup,
        "hold_snapshot": args.hold_snapshot,
        "per_run": {k: [round(v, 1) for v in vs] for k, vs in results.items()},
        "postgres": version,
        "server": redact_dsn(server),
        "python": platform.python_version(),
        **extra,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="short run for CI and smoke checks")
    parser.add_argument("--messages", type=int, help="backlog size per run and side")
    parser.add_argument("--concurrency", type=int, help="messages in flight on every side")
    parser.add_argument("--runs", type=int, help="runs per side (medians are reported)")
    parser.add_argument("--batch-size", type=int, default=50, help="batched receive size")
    parser.add_argument("--warmup", type=int, default=500,
                        help="messages of one uncounted run per side first (0: none)")
    parser.add_argument("--latency-samples", type=int, help="messages for idle latency")
    parser.add_argument("--mode", choices=("standard", "outbox"), default="standard",
                        help="outbox: also compare the outbox with atomic mode")
    parser.add_argument("--hold-snapshot", action="store_true",
                        help="keep a REPEATABLE READ transaction open while each side runs")
    parser.add_argument("--dsn", help="PostgreSQL server (default: ENDPOINT_RUNTIME_DSN/embedded)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def run(argv: list[str] | None = None) -> None:
    run_benchmark("throughput", parse_args, main, argv)


if __name__ == "__main__":
    run()
