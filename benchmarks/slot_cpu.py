"""CPU per message of one receive slot in this process, against the lean asyncpg loop.

No Ray, one connection each, the same backlog: ``runtime`` is one slot of the scale-out
benchmark's batched endpoint (:mod:`benchmarks.scaleout.endpoints`: its handler writes one
sink row; batch 50, optimistic isolation), driven round after round as a receiver drives it;
``lean`` is the lean optimistic loop's work without failures (BEGIN; the transport's batched
receive of 50 rows; per message decode the body and INSERT the sink row; COMMIT). Both run on
uvloop in one process, one after the other, alternating ``--runs`` times; each side's figure
is its process CPU time per message over the drain, and the ratio ``lean / runtime`` of each
pair (1.0: the runtime adds nothing around the same SQL).

Before the drains the process's garbage collector is set as a receiver sets its own
(:func:`endpoint_runtime.runtime.collector.tune_receiver_process`: what exists is frozen, the
young threshold raised); ``--default-collector`` keeps Python's defaults, as this benchmark
did before 2026-11-28 (fourth session).

A drain in one process has none of a deployment's noise (Ray's main loop, other receivers,
the peeker) and none of its parallelism: it says what the runtime's own Python costs per
message, not what a deployment drains (``python -m benchmarks.scaleout`` says that). Run
``python -m benchmarks.slot_cpu --dsn postgresql://postgres@127.0.0.1:5432/postgres``; prints
one JSON object. ``py-spy record -- python -m benchmarks.slot_cpu --runs 1`` shows where the
runtime side's time goes.

``--depth-probe`` adds what a frame of coroutine calls between a task and a round trip costs:
the sink INSERT in one transaction, 20,000 times called directly and 20,000 times through
``DEPTH`` nested coroutines, alternating; the difference per INSERT divided by ``DEPTH``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Collection
from typing import Any

import asyncpg

from benchmarks.common import median, progress, run_benchmark, throwaway_database
from benchmarks.scaleout.endpoints import INSERT_SINK, record
from benchmarks.scaleout.limits import DECODE
from benchmarks.scaleout.peers.sink import CREATE_SINK, DatabaseClock
from benchmarks.scaleout.runtime_sides import job_messages
from benchmarks.throughput import load_backlog
from endpoint_runtime import Endpoint
from endpoint_runtime.chain.pipeline import Pipeline
from endpoint_runtime.connections.connecting import connect_pool
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.runtime.collector import tune_receiver_process
from endpoint_runtime.transactions.counting import SlotCounts, counts_table, create_counts_table
from endpoint_runtime.transport import QueueAddress, statements

BATCH = 50
BODY_BYTES = 100
DEPTH = 24
PROBE_STATEMENTS = 20_000
endpoint = Endpoint("slot_cpu", batch_size=BATCH, batch_isolation="optimistic")
endpoint.register(record)
QUEUE = QueueAddress("slot_cpu")


async def create_tables(pool: asyncpg.Pool) -> None:
    """The queue and the sink table, in a new database."""
    for step in ("create_queue", "create_seq_index", "create_expires_index"):
        await pool.execute(statements.for_queue(QUEUE)[step])
    await pool.execute(CREATE_SINK)


async def fill(pool: asyncpg.Pool, messages: int) -> None:
    await pool.execute(f"TRUNCATE {QUEUE.qualified}; TRUNCATE scaleout_sink")
    async with pool.acquire() as connection:
        clock = await DatabaseClock.measure(connection)
    await load_backlog(pool, QUEUE, job_messages(messages, BODY_BYTES, clock))
    await pool.execute(f"VACUUM ANALYZE {QUEUE.qualified}")


async def runtime_side(pool: asyncpg.Pool, messages: int,
                       only_steps: Collection[str] | None = None) -> float:
    """One slot of the batched endpoint until the queue is empty: CPU us per message.
    ``only_steps``: the built-in steps its chain keeps (``invoke_handlers`` alone: the
    difference says what the others cost)."""
    pipeline = endpoint.create_pipeline()
    if only_steps is not None:
        pipeline = Pipeline(
            endpoint=pipeline.endpoint, local_address=pipeline.local_address,
            steps=[(name, step) for name, step in pipeline.steps.items() if name in only_steps],
            stats=pipeline.stats, failures=pipeline.failures,
            audit_address=pipeline.audit_address, delayed_store=pipeline.delayed_store)
    strategy = endpoint.create_strategy(pipeline, pool, endpoint.settings)
    counts = SlotCounts(counts_table(endpoint.address), deployment_id="bench",
                        receiver_id="bench", slot=0, node_id="bench")
    async with pool.acquire() as connection:
        await create_counts_table(connection, counts_table(endpoint.address))
        await counts.ensure_row(connection)
        slot = strategy.open_slot(connection)
        slot.count_with(counts)
        started = time.process_time()
        while (await slot.round()).taken:
            pass
        spent = time.process_time() - started
        await slot.close()
    return spent / messages * 1e6


async def lean_side(pool: asyncpg.Pool, messages: int) -> float:
    """The lean loop's work without failures until the queue is empty: CPU us per message."""
    receive = statements.for_queue(QUEUE)["receive_batch"]
    async with pool.acquire() as connection:
        started = time.process_time()
        while True:
            async with connection.transaction():
                rows = await connection.fetch(receive, BATCH, 0)
                for row in rows:
                    job = DECODE.decode(row["body"])
                    await connection.execute(INSERT_SINK, job.key, job.sent_at,
                                             job.body.encode())
            if not rows:
                break
        spent = time.process_time() - started
    return spent / messages * 1e6


async def _nested(connection: asyncpg.Connection, depth: int, *args: Any) -> None:
    if depth == 0:
        await connection.execute(*args)
    else:
        await _nested(connection, depth - 1, *args)


async def depth_probe(pool: asyncpg.Pool, runs: int) -> dict[str, Any]:
    """CPU us per INSERT called directly and through :data:`DEPTH` nested coroutines."""
    figures: dict[str, list[float]] = {"direct": [], "nested": []}
    async with pool.acquire() as connection:
        for _ in range(runs):
            for name, depth in (("direct", 0), ("nested", DEPTH)):
                async with connection.transaction():
                    started = time.process_time()
                    for key in range(PROBE_STATEMENTS):
                        await _nested(connection, depth, INSERT_SINK, key, 0.0, b"x" * 100)
                    spent = time.process_time() - started
                figures[name].append(round(spent / PROBE_STATEMENTS * 1e6, 1))
        await connection.execute("TRUNCATE scaleout_sink")
    extra = median([n - d for d, n in zip(figures["direct"], figures["nested"], strict=True)])
    return {"depth": DEPTH, "cpu_us_per_insert": figures,
            "cpu_us_per_frame": round(extra / DEPTH, 2)}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    dsn = resolve_dsn(args.dsn)
    async with throwaway_database(dsn, prefix="er_slot_cpu") as database:
        pool = await connect_pool(with_database(dsn, database), min_size=1, max_size=2)
        try:
            await create_tables(pool)
            if not args.default_collector:
                tune_receiver_process()
            figures: dict[str, list[float]] = {"runtime": [], "lean": []}
            for run in range(1, args.runs + 1):
                for name, side in (("lean", lean_side), ("runtime", runtime_side)):
                    await fill(pool, args.messages)
                    figures[name].append(round(await side(pool, args.messages), 1))
                    written = await pool.fetchval("SELECT count(*) FROM scaleout_sink")
                    if written != args.messages:
                        raise RuntimeError(f"{name}: {written} sink rows, {args.messages} sent")
                progress(f"run {run}: lean {figures['lean'][-1]} us, runtime "
                         f"{figures['runtime'][-1]} us CPU per message")
            probe = await depth_probe(pool, args.runs) if args.depth_probe else None
        finally:
            await pool.close()
    ratios = [round(lean / runtime, 3)
              for lean, runtime in zip(figures["lean"], figures["runtime"], strict=True)]
    return {
        "benchmark": "slot_cpu", "messages": args.messages, "batch_size": BATCH,
        "runs": args.runs, "collector": "default" if args.default_collector else "receiver's",
        "cpu_us_per_message": figures,
        "median_cpu_us_per_message": {name: median(values) for name, values in figures.items()},
        "lean_vs_runtime_cpu": ratios, "median_lean_vs_runtime_cpu": median(ratios),
        **({"depth_probe": probe} if probe else {}),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.slot_cpu",
        description="CPU per message of one batched receive slot against the lean loop")
    parser.add_argument("--dsn", default=None, help="server DSN (default: the embedded one)")
    parser.add_argument("--messages", type=int, default=20_000, help="backlog per drain")
    parser.add_argument("--runs", type=int, default=5, help="alternating pairs of drains")
    parser.add_argument("--depth-probe", action="store_true",
                        help="also the CPU cost of a coroutine frame around a round trip")
    parser.add_argument("--default-collector", action="store_true",
                        help="keep Python's garbage collector settings (not a receiver's)")
    parser.add_argument("--quick", action="store_true", help="2 pairs of 5,000 messages, "
                        "result not kept in results/")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.messages = 2, 5_000
    if args.runs < 1 or args.messages < 1:
        parser.error("--runs and --messages must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    run_benchmark("slot_cpu", parse, measure, argv)


if __name__ == "__main__":
    main()
