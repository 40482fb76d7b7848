"""What a queue's wake-up costs its senders: the NOTIFY trigger with the channel marked waiting
(every send notifies: what every send paid before ``transport.waiting``), with no mark (a busy
endpoint: the trigger only looks), and without the trigger (``notify_on_send=False``: a plain
INSERT, the raw-PostgreSQL baseline).

``--senders`` connections send ``--messages`` messages as fast as they can, one per
transaction (the runtime's send statement), into a queue no one receives from; the three
layouts alternate ``--runs`` times in one fresh database. Prints one JSON object: sends/s per
layout (medians and every run) and each layout against the plain INSERT.

    python -m benchmarks.wakeups --dsn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg
import msgspec

from benchmarks.common import median, progress, run_benchmark, throwaway_database
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn, with_database
from endpoint_runtime.transport import QueueAddress, queues, sending
from endpoint_runtime.transport.waiting import Waiting

QUEUE = QueueAddress("wakeups_bench")
LAYOUTS = ("no_trigger", "trigger_not_waiting", "trigger_waiting")


class Job(msgspec.Struct):
    n: int


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wakeups", description=__doc__)
    parser.add_argument("--dsn", help="the server (default: the embedded PostgreSQL)")
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--messages", type=int, default=8_000, help="per run")
    parser.add_argument("--runs", type=int, default=5, help="alternating runs per layout")
    parser.add_argument("--quick", action="store_true", help="2 runs, result not kept")
    return parser.parse_args(argv)


async def _prepare(pool: asyncpg.Pool, layout: str) -> None:
    async with pool.acquire() as connection:
        await connection.execute(f"DROP TABLE IF EXISTS {QUEUE.qualified}")
        await queues.create_queue(connection, QUEUE, notify_on_send=layout != "no_trigger")
        if layout == "trigger_waiting":
            await Waiting(QUEUE).mark(connection)
        elif layout == "trigger_not_waiting":
            await Waiting(QUEUE).clear(connection)


async def _sends_per_second(pool: asyncpg.Pool, senders: int, messages: int) -> float:
    keys = iter(range(messages))  # one iterator for all senders: each key is sent once

    async def sender() -> None:
        async with pool.acquire() as connection:
            for key in keys:
                await sending.send(connection, QUEUE, create_outgoing(Job(key)))

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(senders)))
    return messages / (time.perf_counter() - started)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    dsn = resolve_dsn(args.dsn)
    runs = 2 if args.quick else args.runs
    measured: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    async with throwaway_database(dsn, prefix="er_wakeups") as database:
        pool = await asyncpg.create_pool(with_database(dsn, database), min_size=args.senders,
                                         max_size=args.senders)
        try:
            for run in range(1, runs + 1):
                for layout in LAYOUTS:
                    await _prepare(pool, layout)
                    rate = await _sends_per_second(pool, args.senders, args.messages)
                    measured[layout].append(round(rate, 1))
                    progress(f"[wakeups] run {run}/{runs} {layout:<20} {rate:>9,.0f} sends/s")
        finally:
            await pool.close()
    medians = {layout: median(rates) for layout, rates in measured.items()}
    baseline = medians["no_trigger"]
    return {
        "benchmark": "wakeups",
        "dsn": redact_dsn(dsn),
        "senders": args.senders,
        "messages_per_run": args.messages,
        "sends_per_s_median": medians,
        "sends_per_s_runs": measured,
        "vs_plain_insert": {layout: round(rate / baseline, 3)
                            for layout, rate in medians.items()},
        "not_waiting_vs_waiting": round(medians["trigger_not_waiting"]
                                        / medians["trigger_waiting"], 3),
    }


if __name__ == "__main__":
    run_benchmark("wakeups", parse, main)
