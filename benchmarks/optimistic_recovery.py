"""``python -m benchmarks.optimistic_recovery``: two recoveries of an optimistic batch compared.

When a message of an optimistic batch fails at its own handler, the runtime excludes it (the
batch rolls back to its checkpoint, the messages before it run again, the batch goes on after
it); a failure that shows elsewhere is found by bisection. This benchmark drains the same
backlog with 0%, 1% and 10% of the messages failing on every attempt (after their write;
default immediate retries, delayed retries off), once with the runtime's choice and once with
every failure bisected (``OptimisticBatch.bisect_every_failure``), and counts what each costs:
handler runs and statements sent on the slots' connections (round trips), besides the rate.

Four receive slots of one batched endpoint (batch_size 50) in this process, without Ray, on a
fresh database. The baseline is the same drain without failures, in the same run: each rate is
also given as a ratio to it. The last stdout line is the result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.common import median, progress, run_async, throwaway_database
from benchmarks.scaleout.endpoints import Job, record
from benchmarks.scaleout.peers.sink import CREATE_SINK, DatabaseClock
from benchmarks.scaleout.runtime_sides import job_messages
from benchmarks.throughput import load_backlog
from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transactions.optimistic_batch import OptimisticBatch

SLOTS = 4
COUNTED = frozenset({"execute", "executemany", "fetch", "fetchrow", "fetchval"})


class JobFailedError(Exception):
    pass


def failing_endpoint(every: int) -> Endpoint:
    """Batched (50), the message whose key is the last of each ``every`` fails (0: none)."""
    endpoint = Endpoint(f"recovery_{every}", batch_size=50, delayed_retries=0)

    async def record_or_fail(message: Job, context: HandlerContext) -> None:
        await record(message, context)
        if every and message.key % every == every - 1:
            raise JobFailedError(message.key)

    endpoint.register(record_or_fail)
    return endpoint


class CountingConnection:
    """A slot's connection that counts the statements sent on it (each a round trip)."""

    def __init__(self, connection: Any, counts: dict[str, int]) -> None:
        self._connection = connection
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._connection, name)
        if name not in COUNTED:
            return attribute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts["round_trips"] += 1
            return await attribute(*args, **kwargs)

        return counted


@contextmanager
def bisecting(on: bool) -> Iterator[None]:
    OptimisticBatch.bisect_every_failure = on
    try:
        yield
    finally:
        OptimisticBatch.bisect_every_failure = False


async def drain(dsn: str, messages: int, every: int, bisect: bool) -> dict[str, float]:
    endpoint = failing_endpoint(every)
    async with throwaway_database(dsn, prefix="er_recovery") as database:
        settings = TransportSettings(dsn=with_database(dsn, database), pool_max_size=SLOTS + 2)
        async with PostgresTransport.connect(settings) as transport:
            for queue in (endpoint.name, endpoint.settings.error_queue):
                await transport.create_queue(queue)
            await transport.pool.execute(CREATE_SINK)
            async with transport.pool.acquire() as connection:
                clock = await DatabaseClock.measure(connection)
            await load_backlog(transport.pool, transport.address(endpoint.name),
                               job_messages(messages, 100, clock))
            pipeline = endpoint.create_pipeline()
            strategy = endpoint.create_strategy(pipeline, transport.pool, endpoint.settings)
            counts = {"runs": 0, "round_trips": 0}
            run = pipeline.run

            async def counting_run(message: Any, unit: Any) -> Any:
                counts["runs"] += 1
                return await run(message, unit)

            pipeline.run = counting_run  # type: ignore[method-assign]

            async def slot() -> None:
                async with transport.pool.acquire() as connection:
                    receive_slot = strategy.open_slot(
                        CountingConnection(connection, counts))  # type: ignore[arg-type]
                    while (await receive_slot.round()).taken:
                        pass
                    await receive_slot.close()

            with bisecting(bisect):
                started = time.perf_counter()
                await asyncio.gather(*(slot() for _ in range(SLOTS)))
                seconds = time.perf_counter() - started
            left = await transport.depth(endpoint.name)
            settled = (await transport.pool.fetchval("SELECT count(*) FROM scaleout_sink")
                       + await transport.depth(endpoint.settings.error_queue))
            if left or settled != messages:
                raise RuntimeError(f"{left} left in the queue, {settled} of {messages} settled")
    return {"msgs_per_s": messages / seconds, **counts}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    dsn = resolve_dsn(args.dsn)
    sides = [("none", 0, False)] + [
        (f"{name}_{percent}pct", 100 // percent, bisect)
        for percent in (1, 10) for name, bisect in (("exclusion", False), ("bisection", True))]
    drains: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in sides}
    for run in range(1, args.runs + 1):
        for name, every, bisect in sides:
            drains[name].append(await drain(dsn, args.messages, every, bisect))
            progress(f"run {run}/{args.runs} {name:<16} "
                     f"{drains[name][-1]['msgs_per_s']:>8,.0f} msg/s")
    result: dict[str, Any] = {"messages": args.messages, "slots": SLOTS, "batch_size": 50,
                              "runs": args.runs, "sides": {}}
    for name, runs in drains.items():
        ratios = [d["msgs_per_s"] / base["msgs_per_s"]
                  for d, base in zip(runs, drains["none"], strict=True)]
        result["sides"][name] = {
            "msgs_per_s": round(median([d["msgs_per_s"] for d in runs])),
            "vs_no_failures": round(median(ratios), 3),
            "handler_runs": median([d["runs"] for d in runs]),
            "round_trips": median([d["round_trips"] for d in runs])}
    return result


def run() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.optimistic_recovery",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="the server (default: the embedded PostgreSQL)")
    parser.add_argument("--messages", type=int, default=2400)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    configure_logging("error", json=True)  # the failures' warnings are not what is measured
    print(json.dumps(run_async(main(args))), flush=True)


if __name__ == "__main__":
    run()
