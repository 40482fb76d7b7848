"""The cost of OpenTelemetry tracing: throughput with tracing on against off, paired.

Per run the same backlog is drained by four deployments (the order alternates between runs):

- ``off``: atomic mode, one message per transaction, tracing off (``benchmarks.endpoints:
  atomic``, the ``ours`` side of ``benchmarks.throughput``);
- ``on``: the same with ``tracing=True``, every span sampled (``always_on``) and exported by
  the batch span processor over OTLP/HTTP to a sink that drops them (``benchmarks.otlp_sink``,
  its own process);
- ``batched_off`` / ``batched_on``: batched receive (``--batch-size``), on with the
  ``parentbased_traceidratio`` sampler at 10 %, draining a backlog of ``--batched-messages``
  (20,000: at about ten times the rate, a run as long as the single-message sides'; with
  2,000 a batched run lasted 0.2 s and its pairs scattered from 0.3 to 1.0 on a loaded
  machine).

The raw-PostgreSQL loop of ``benchmarks.throughput`` runs too (``raw``), as the baseline of
the run. Each run gives the ratios on/off and batched_on/batched_off of that run; the result
reports their medians (the pairs share the machine's state of the moment). Run
``python -m benchmarks.tracing --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import asyncpg

from benchmarks.common import median, progress, run_benchmark, throwaway_database
from benchmarks.throughput import INPUT, SINK_ADDRESS, deploy, run_deployed, run_raw
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.transport import QueueAddress, queues
from tests.cluster.nodes import free_port

QUICK = {"messages": 2_000, "concurrency": 4, "runs": 5}
SIDES = {  # side: (endpoint path, queue, OTEL_TRACES_SAMPLER or None when off)
    "off": ("benchmarks.endpoints:atomic", "bench_atomic", None),
    "on": ("benchmarks.traced_endpoints:traced", "bench_traced", "always_on"),
    "batched_off": ("benchmarks.endpoints:batched", "bench_batched", None),
    "batched_on": ("benchmarks.traced_endpoints:traced_batched", "bench_traced_batched",
                   "parentbased_traceidratio"),
}


async def deploy_side(side: str, dsn: str, args: argparse.Namespace,
                      sink: str) -> EndpointDeployment:
    """Deploy a side; a traced one takes the OTEL_* variables set here (the deployment hands
    the deploying process's variables to its receivers)."""
    path, _, sampler = SIDES[side]
    if sampler is not None:
        os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": sink, "OTEL_TRACES_SAMPLER": sampler,
                           "OTEL_TRACES_SAMPLER_ARG": str(args.ratio)})
    overrides: dict[str, Any] = {"batch_size": args.batch_size} if "batched" in side else {}
    return await deploy(path, dsn, args.concurrency, **overrides)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    port = free_port()
    sink = await asyncio.create_subprocess_exec(sys.executable, "-m", "benchmarks.otlp_sink",
                                                str(port))
    sides = ["raw", *SIDES]
    results: dict[str, list[float]] = {side: [] for side in sides}
    try:
        async with throwaway_database(server, "er_tracing") as database:
            dsn = with_database(server, database)
            pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
            try:
                for queue in (INPUT, SINK_ADDRESS, *(QueueAddress(q) for _, q, _ in
                                                     SIDES.values())):
                    async with pool.acquire() as connection:
                        await queues.create_queue(connection, queue,
                                                  notify_on_send=queue != SINK_ADDRESS)
                progress("starting deployments (Ray)...")
                deployed = {side: await deploy_side(side, dsn, args, f"http://127.0.0.1:{port}")
                            for side in SIDES}
                try:
                    def backlog(side: str) -> int:  # batched sides drain ~10x faster
                        return args.batched_messages if "batched" in side else args.messages

                    async def run_side(side: str, messages: int) -> float:
                        if side == "raw":
                            return await run_raw(pool, dsn, messages, args.concurrency)
                        return await run_deployed(pool, deployed[side],
                                                  QueueAddress(SIDES[side][1]), messages)

                    for side in sides:
                        await run_side(side, args.warmup)
                    for run in range(args.runs):
                        order = sides if run % 2 == 0 else sides[::-1]
                        for side in order:
                            rate = await run_side(side, backlog(side))
                            results[side].append(rate)
                            progress(f"run {run + 1}/{args.runs} {side:12s} {rate:9.0f} msg/s")
                finally:
                    for deployment in deployed.values():
                        await deployment.stop()
            finally:
                await pool.close()
    finally:
        sink.terminate()
        await asyncio.wait_for(sink.wait(), timeout=10)
    pairs = {
        "on_vs_off": [on / off for on, off in zip(results["on"], results["off"], strict=True)],
        "batched_on_vs_off": [on / off for on, off in zip(
            results["batched_on"], results["batched_off"], strict=True)],
    }
    return {
        "benchmark": "tracing",
        "messages": args.messages, "batched_messages": args.batched_messages,
        "runs": args.runs, "concurrency": args.concurrency,
        "batch_size": args.batch_size, "sampler_ratio_batched": args.ratio,
        "msgs_per_s": {side: round(median(rates), 1) for side, rates in results.items()},
        "ratio_to_raw": {side: round(median(rates) / median(results["raw"]), 3)
                         for side, rates in results.items() if side != "raw"},
        "paired_ratios": {name: [round(r, 3) for r in ratios] for name, ratios in pairs.items()},
        "median_paired_ratio": {name: round(median(r), 3) for name, r in pairs.items()},
        "targets": {"on_vs_off": 0.85, "batched_on_vs_off": 0.9},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short run (the defaults)")
    parser.add_argument("--messages", type=int, default=QUICK["messages"])
    parser.add_argument("--concurrency", type=int, default=QUICK["concurrency"])
    parser.add_argument("--runs", type=int, default=QUICK["runs"])
    parser.add_argument("--batched-messages", type=int, default=20_000,
                        help="the backlog of the batched sides (at ~10x the rate: about as "
                             "long a run as the single-message sides')")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--ratio", type=float, default=0.1,
                        help="the batched side's sampling ratio (parent-based)")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--dsn", help="PostgreSQL server (default: ENDPOINT_RUNTIME_DSN/embedded)")
    return parser.parse_args(argv)


def run(argv: list[str] | None = None) -> None:
    run_benchmark("tracing", parse_args, main, argv)


if __name__ == "__main__":
    run()
