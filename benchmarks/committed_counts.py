"""What the committed counts cost: two input queues drained at once, one side counting.

In one process, without Ray: each side is ``--slots`` receive slots of the benchmark endpoint's
own strategy (``bench_atomic``, then ``bench_batched``) on its own input queue; one side's
slots have their rows of committed counts (``endpoint_runtime.transactions.counting``), the
other's have none, and the side that counts alternates from window to window. Both sides run
at the same moment, so the load of a shared machine falls on both alike. Per window: messages
the counting side processed / messages the other side processed (1.0: no cost). Each window
also checks that the counted total equals the messages the counting side processed.

Run ``python -m benchmarks.committed_counts --help``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

import asyncpg

from benchmarks.common import run_async, throwaway_database
from benchmarks.endpoints import SINK, atomic, batched
from benchmarks.throughput import load_backlog, work_messages
from endpoint_runtime import Endpoint
from endpoint_runtime.connections.connecting import PostgresTransport, connect_pool
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transactions.counting import SlotCounts, counts_table, create_counts_table
from endpoint_runtime.transport import QueueAddress

SIDES = [QueueAddress("counts_bench_a"), QueueAddress("counts_bench_b")]


async def run_side(pool: asyncpg.Pool, endpoint: Endpoint, queue: QueueAddress, slots: int,
                   deployment_id: str | None, stop: asyncio.Event) -> None:
    """``slots`` slots receiving from ``queue`` until ``stop``; counting when given an id."""
    pipeline = endpoint.create_pipeline(endpoint.settings)
    pipeline.local_address = queue
    strategy = endpoint.create_strategy(pipeline, pool, endpoint.settings)

    async def slot(number: int) -> None:
        async with pool.acquire() as connection:
            receive_slot = strategy.open_slot(connection)
            if deployment_id is not None:
                receive_slot.count_with(SlotCounts(
                    counts_table(queue), deployment_id=deployment_id, receiver_id="bench",
                    slot=number, node_id="local"))
                await receive_slot.counts.ensure_row(connection)
            while not stop.is_set():
                await receive_slot.round()
            await receive_slot.close()

    await asyncio.gather(*(slot(n) for n in range(slots)))


async def compare(pool: asyncpg.Pool, endpoint: Endpoint, args: argparse.Namespace,
                  backlog: int) -> dict[str, Any]:
    ratios, windows = [], []
    for window in range(args.windows):
        counting = window % 2
        for queue in SIDES:
            await pool.execute(f"DELETE FROM {queue.qualified}")
            await pool.execute(f"VACUUM {queue.qualified}")
            await load_backlog(pool, queue, work_messages(backlog))
        await pool.execute(f"DELETE FROM {QueueAddress(SINK).qualified}")
        deployment_id = f"{endpoint.name}-{window}"
        stop = asyncio.Event()
        sides = [asyncio.create_task(run_side(
            pool, endpoint, queue, args.slots, deployment_id if i == counting else None, stop))
            for i, queue in enumerate(SIDES)]
        await asyncio.sleep(args.seconds)
        stop.set()
        await asyncio.gather(*sides)
        done = [backlog - await pool.fetchval(f"SELECT count(*) FROM {q.qualified}")
                for q in SIDES]
        if max(done) >= backlog:
            raise SystemExit(f"a backlog of {backlog} ran out within the window: raise it")
        counted = await pool.fetchval(
            f"SELECT coalesce(sum(processed), 0) FROM {counts_table(SIDES[counting]).qualified}"
            " WHERE deployment_id = $1", deployment_id)
        if counted != done[counting]:
            raise SystemExit(f"counted {counted}, processed {done[counting]}")
        ratios.append(done[counting] / done[1 - counting])
        windows.append([done[1 - counting], done[counting]])
    return {"ratio_median": round(statistics.median(ratios), 3),
            "processed_without_with": windows}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    async with throwaway_database(server, "er_counts_bench") as name:
        dsn = with_database(server, name)
        async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
            for queue in [*SIDES, QueueAddress(SINK)]:
                await transport.create_queue(queue)
        pool = await connect_pool(dsn, min_size=1, max_size=4 * args.slots + 4)
        try:
            async with pool.acquire() as connection:
                for queue in SIDES:
                    await create_counts_table(connection, counts_table(queue))
            return {
                "benchmark": "committed_counts", "windows": args.windows,
                "seconds": args.seconds, "slots": args.slots,
                "atomic": await compare(pool, atomic, args, args.backlog),
                "batched": await compare(pool, batched, args, args.batched_backlog),
            }
        finally:
            await pool.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.committed_counts",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=16, help="windows per endpoint")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a window")
    parser.add_argument("--slots", type=int, default=4, help="receive slots per side")
    parser.add_argument("--backlog", type=int, default=8_000,
                        help="messages per side and window, atomic")
    parser.add_argument("--batched-backlog", type=int, default=60_000,
                        help="messages per side and window, batched")
    parser.add_argument("--dsn", default="", help="PostgreSQL server (default: embedded)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run_async(main(parse()))), flush=True)
