"""Where the idle latency (send -> handler start) goes, message by message.

An idle atomic deployment (the throughput benchmark's ``bench_atomic``) gets one message at a
time (``--gap`` apart). For each message the script records, on the machine's one wall clock:

- ``send``: the sender's INSERT and its COMMIT (the WAL flush), from before the call to its
  return: what the throughput benchmark's latency includes before the runtime sees anything;
- ``notify``: from the COMMIT's return to the NOTIFY arriving on a LISTEN connection of this
  process (the receiver's LISTEN connection gets the same notification from the server);
- ``pickup``: from that NOTIFY to the handler's start in the receiver (the receiver waking on
  its own NOTIFY, the receive's round trip, decoding);
- ``total``: send start to handler start, the figure ``benchmarks.throughput`` reports as
  ``latency_p50_ms`` / ``latency_p99_ms``.

Around each message it also reads the scheduler's counters (``/proc/<pid>/task/*/schedstat``)
of the receiver process, of every PostgreSQL backend of the database and of this process
(the sender): the milliseconds they
ran on a CPU and the milliseconds they were runnable but waited for one (``*_waiting``), over
the window from the snapshot before the send to the first one after the handler started
(``window``). A slow pickup with as much ``receiver_waiting`` was the machine's CPUs taken by
others; one with as much ``receiver_cpu`` was the receiver's own work.

``--after-backlog N`` first drains N messages through the deployment and starts the trace at
once, as the throughput benchmark measures its latency right after its runs.

The last line of stdout is JSON: percentiles of each stage, the slowest samples with their
stages and wall-clock offsets (to line them up with periodic work), and the load average.
``python -m benchmarks.latency --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from typing import Any

import asyncpg
import msgspec

from benchmarks.common import percentile, progress, run_benchmark, throwaway_database
from benchmarks.endpoints import Echo, Work
from benchmarks.throughput import (
    SINK_ADDRESS,
    deploy,
    load_backlog,
    sink_baseline,
    wait_for_sink,
    work_messages,
)
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn, with_database
from endpoint_runtime.transport import QueueAddress, queues, sending

QUEUE = QueueAddress("bench_atomic")
STAGES = ("send", "notify", "pickup", "total")


def schedstat(pids: list[int]) -> tuple[float, float]:
    """Milliseconds the threads of ``pids`` have run on a CPU and waited for one (runnable,
    not running: the scheduler's run queue), from ``/proc/<pid>/task/*/schedstat``."""
    running = waiting = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    on_cpu, run_delay, _ = f.read().split()
                    running += int(on_cpu)
                    waiting += int(run_delay)
    return running / 1e6, waiting / 1e6


async def trace(dsn: str, samples: int, gap_s: float,
                after_backlog: int) -> list[dict[str, float]]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    listener = await asyncpg.connect(dsn)
    notified: list[float] = []
    await listener.add_listener(QUEUE.notify_channel,
                                lambda *_: notified.append(time.time()))
    try:
        for queue in (QUEUE, SINK_ADDRESS):
            async with pool.acquire() as connection:
                await queues.create_queue(connection, queue, notify_on_send=queue == QUEUE)
        deployment = await deploy("benchmarks.endpoints:atomic", dsn, 4)
        try:
            if after_backlog:
                # As in benchmarks.throughput, whose latency follows the throughput runs.
                progress(f"draining a backlog of {after_backlog} first...")
                baseline = await sink_baseline(pool)
                await load_backlog(pool, QUEUE, work_messages(after_backlog))
                await wait_for_sink(pool, baseline, after_backlog)
                await queues.purge(pool, SINK_ADDRESS)
            else:
                await asyncio.sleep(2)  # the receiver idle
            baseline = await sink_baseline(pool)
            notified.clear()  # the backlog's own notification
            receiver = await deployment.receiver_pids()
            backends = [r["pid"] for r in await pool.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")]
            sends: list[tuple[float, float]] = []
            sched: list[tuple[float, ...]] = []
            async with pool.acquire() as connection:
                for i in range(samples):
                    sched.append((time.time(), *schedstat(receiver), *schedstat(backends),
                                  *schedstat([os.getpid()])))
                    started = time.time()
                    await sending.send(connection, QUEUE, create_outgoing(Work(i, started)))
                    sends.append((started, time.time()))
                    await asyncio.sleep(gap_s)
            await wait_for_sink(pool, baseline, samples)
        finally:
            await deployment.stop()
        rows = await pool.fetch(f"SELECT body FROM {SINK_ADDRESS.qualified}")
    finally:
        await listener.close()
        await pool.close()
    decoder = msgspec.json.Decoder(Echo)
    handler_start = {e.n: e.started_at for e in (decoder.decode(r["body"]) for r in rows)}
    if len(notified) != samples:
        raise RuntimeError(f"{len(notified)} notifications for {samples} sends")
    first = sends[0][0]
    sched.append((float("inf"), *sched[-1][1:]))
    traced = []
    for n, (sent, committed) in enumerate(sends):
        # The scheduler's figures over the snapshots around this message: from the one taken
        # before its send to the first one taken after its handler started.
        end = next(k for k in range(n + 1, len(sched)) if sched[k][0] >= handler_start[n])
        deltas = [b - a for a, b in zip(sched[n][1:], sched[end][1:], strict=True)]
        traced.append({
            "n": n,
            "at_s": round(sent - first, 3),
            "send": (committed - sent) * 1000,
            "notify": (notified[n] - committed) * 1000,
            "pickup": (handler_start[n] - notified[n]) * 1000,
            "total": (handler_start[n] - sent) * 1000,
            "window": (min(sched[end][0], time.time()) - sched[n][0]) * 1000,
            "receiver_cpu": deltas[0], "receiver_waiting": deltas[1],
            "backends_cpu": deltas[2], "backends_waiting": deltas[3],
            "sender_cpu": deltas[4], "sender_waiting": deltas[5],
        })
    return traced


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    load_before = os.getloadavg()
    async with throwaway_database(server, "er_latency") as database:
        progress(f"{args.samples} messages, {args.gap * 1000:.0f} ms apart...")
        rows = await trace(with_database(server, database), args.samples, args.gap,
                           args.after_backlog)
    slowest = sorted(rows, key=lambda r: r["total"], reverse=True)[: args.show]
    return {
        "benchmark": "latency",
        "samples": args.samples,
        "gap_ms": args.gap * 1000,
        "after_backlog": args.after_backlog,
        **{f"{stage}_ms": {q: round(percentile([r[stage] for r in rows], q), 2)
                           for q in (50, 90, 99, 100)} for stage in STAGES},
        "slowest": [{k: round(v, 2) for k, v in r.items()} for r in slowest],
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "server": redact_dsn(server),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between sends")
    parser.add_argument("--after-backlog", type=int, default=0, metavar="N",
                        help="drain N messages through the deployment just before the trace")
    parser.add_argument("--show", type=int, default=8, help="slowest samples to list")
    parser.add_argument("--dsn", help="server (default: ENDPOINT_RUNTIME_DSN or embedded)")
    parser.add_argument("--quick", action="store_true", help="200 samples; no result file")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples = min(args.samples, 200)
    return args


if __name__ == "__main__":
    run_benchmark("latency", parse_args, main)
