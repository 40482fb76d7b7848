"""Transport throughput: our send and receive against plain asyncpg running the same SQL.

Both sides run in the same process, on the same server and database, with the same
connections, concurrency and message contents; only the code between the loop and asyncpg
differs. Run ``python -m benchmarks.transport --help``; see ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack, suppress
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec
import structlog

from benchmarks.common import (
    median,
    progress,
    run_async,
    summarize,
    throwaway_database,
    write_result,
)
from benchmarks.transport_sides import Worker, Workload, build_workload, receive_worker, send_worker
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn
from endpoint_runtime.transport import queues
from endpoint_runtime.transport.addresses import QueueAddress

QUICK = {"messages": 3_000, "concurrency": 4, "runs": 3}
FULL = {"messages": 20_000, "concurrency": 8, "runs": 5}
WARMUP_MESSAGES = 500
SIDES = ("raw", "ours")
PHASES = ("send", "receive")
SERVER_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "max_connections",
)


async def timed(connections: Sequence[asyncpg.Connection], worker: Worker) -> tuple[float, int]:
    """Run one worker per connection concurrently; only this is timed.

    Args:
        connections: Already acquired connections, one task each.
        worker: What each task runs.

    Returns:
        Elapsed seconds and the number of messages the workers handled in total.
    """
    start = time.perf_counter()
    counts = await asyncio.gather(*(worker(connection) for connection in connections))
    return time.perf_counter() - start, sum(counts)


async def checkpoint(admin: asyncpg.Connection) -> None:
    """Flush dirty pages before a timed phase so that no side inherits the other's writes."""
    with suppress(asyncpg.InsufficientPrivilegeError):
        await admin.execute("CHECKPOINT")


async def run_once(
    connections: Sequence[asyncpg.Connection],
    admin: asyncpg.Connection,
    workload: Workload,
    label: str,
    raw_first: bool,
    aa: bool = False,
) -> dict[str, Any]:
    """One run: send all messages on each side, then receive them all, in alternating order.

    Args:
        connections: The concurrent tasks' connections.
        admin: A separate connection for DDL, checkpoints and row counts (never timed).
        workload: The messages to send on each side.
        label: Suffix of this run's queue table names.
        raw_first: Whether raw goes first in both phases (else ours does).
        aa: Run the raw code on both sides (A/A calibration of the harness's noise).

    Returns:
        Messages per second and seconds of each side and phase, and the ratios.
    """
    count = len(workload.outgoing)
    order = SIDES if raw_first else SIDES[::-1]
    addresses = {side: QueueAddress(f"bench_{side}_{label}") for side in SIDES}
    for address in addresses.values():
        await queues.create_queue(admin, address, notify_on_send=True)
    figures: dict[str, Any] = {"order": "-".join(order)}
    for phase in PHASES:
        for side in order:
            address = addresses[side]
            code = "raw" if aa else side
            await checkpoint(admin)
            if phase == "send":
                seconds, handled = await timed(connections, send_worker(code, address, workload))
                left = count
            else:
                seconds, handled = await timed(connections, receive_worker(code, address))
                left = 0
            depth = await queues.depth(admin, address)
            if handled != count or depth != left:
                raise RuntimeError(
                    f"{side} {phase}: handled {handled} of {count}, "
                    f"{depth} rows left (expected {left})"
                )
            prefix = "" if side == "ours" else "raw_"
            figures[f"{prefix}{phase}_per_s"] = round(count / seconds, 1)
            figures[f"{prefix}{phase}_seconds"] = round(seconds, 4)
    for phase in PHASES:
        ratio = figures[f"{phase}_per_s"] / figures[f"raw_{phase}_per_s"]
        figures[f"{phase}_ratio"] = round(ratio, 4)
    for address in addresses.values():
        await queues.drop_queue(admin, address)
    return figures


async def server_facts(admin: asyncpg.Connection) -> dict[str, Any]:
    """Version and durability settings of the server, for the record."""
    settings = {name: await admin.fetchval(f"SHOW {name}") for name in SERVER_SETTINGS}
    return {
        "postgres_version": await admin.fetchval("SHOW server_version"),
        "postgres_version_full": await admin.fetchval("SELECT version()"),
        "postgres_settings": settings,
    }


async def benchmark(
    dsn: str, messages: int, concurrency: int, runs: int, aa: bool = False
) -> dict[str, Any]:
    """Warm up, then do ``runs`` runs in a throwaway database.

    Args:
        dsn: The server (any database on it); ``""`` for the libpq environment.
        messages: Messages per run and side.
        concurrency: Concurrent tasks, one pooled connection each.
        runs: Measured runs; even runs put raw first, odd ones ours.
        aa: Run the raw code on both sides.

    Returns:
        The headline figures, the per-run figures and the server's facts.
    """
    workload = build_workload(messages)
    async with throwaway_database(dsn) as database:
        admin = await asyncpg.connect(dsn or None, database=database)
        pool = await asyncpg.create_pool(
            dsn or None, database=database, min_size=concurrency, max_size=concurrency
        )
        try:
            facts = await server_facts(admin)
            progress(
                f"PostgreSQL {facts['postgres_version']}, database {database}, "
                f"settings {facts['postgres_settings']}"
            )
            if facts["postgres_settings"]["fsync"] != "on":
                progress("WARNING: fsync is off: figures do not reflect a durable server")
            async with AsyncExitStack() as stack:
                connections = [
                    await stack.enter_async_context(pool.acquire()) for _ in range(concurrency)
                ]
                warm = workload.head(min(WARMUP_MESSAGES, messages))
                await run_once(connections, admin, warm, "warmup", raw_first=True, aa=aa)
                progress(f"warm-up done ({len(warm.outgoing)} messages each side)")
                per_run = []
                for index in range(runs):
                    figures = await run_once(
                        connections,
                        admin,
                        workload,
                        str(index + 1),
                        raw_first=index % 2 == 0,
                        aa=aa,
                    )
                    per_run.append({"run": index + 1, **figures})
                    progress(
                        f"run {index + 1}/{runs} ({figures['order']} first): "
                        f"send {figures['send_per_s']}/s vs raw {figures['raw_send_per_s']}/s "
                        f"({figures['send_ratio']}), receive {figures['receive_per_s']}/s vs "
                        f"raw {figures['raw_receive_per_s']}/s ({figures['receive_ratio']})"
                    )
        finally:
            await pool.close()
            await admin.close()
    sample_headers, sample_body = workload.raw_rows[0][1], workload.raw_rows[0][2]
    return {
        **headline(per_run),
        "messages": messages,
        "concurrency": concurrency,
        "runs": runs,
        "warmup_messages": min(WARMUP_MESSAGES, messages),
        "header_bytes": len(sample_headers.encode()),
        "body_bytes": len(sample_body),
        "per_run": per_run,
        **facts,
    }


def headline(per_run: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs, ratios of medians, medians of per-run ratios, and the spread.

    Args:
        per_run: The figures of each run, as :func:`run_once` returns them.

    Returns:
        ``send_per_s``, ``raw_send_per_s``, ``send_ratio`` (ours / raw of the medians),
        ``send_ratio_paired_median``, the same for receive, and ``spread``.
    """
    result: dict[str, Any] = {}
    spread: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        for key in (f"{phase}_per_s", f"raw_{phase}_per_s", f"{phase}_ratio"):
            spread[key] = summarize([run[key] for run in per_run])
        ours, raw = spread[f"{phase}_per_s"]["median"], spread[f"raw_{phase}_per_s"]["median"]
        result[f"{phase}_per_s"] = round(ours, 1)
        result[f"raw_{phase}_per_s"] = round(raw, 1)
        result[f"{phase}_ratio"] = round(ours / raw, 4)
        result[f"{phase}_ratio_paired_median"] = round(
            median([run[f"{phase}_ratio"] for run in per_run]), 4
        )
    result["spread"] = spread
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line and fill in the mode's defaults.

    Args:
        argv: Arguments without the program name; ``None`` for ``sys.argv[1:]``.

    Returns:
        The arguments, with ``messages``, ``concurrency`` and ``runs`` always set.
    """
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transport",
        description="Send and receive throughput of endpoint_runtime's transport against a "
        "plain asyncpg loop running the same SQL (ratio = ours / raw, medians over runs). "
        "Progress goes to stderr; the last line of stdout is the result as JSON.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"short run: {QUICK['messages']} messages, concurrency "
        f"{QUICK['concurrency']}, {QUICK['runs']} runs, no result file "
        f"(default: {FULL['messages']}, {FULL['concurrency']}, {FULL['runs']}, "
        "written to benchmarks/results/)",
    )
    parser.add_argument("--messages", type=int, help="messages per run and side")
    parser.add_argument("--concurrency", type=int, help="concurrent tasks (one connection each)")
    parser.add_argument("--runs", type=int, help="measured runs (order alternates)")
    parser.add_argument(
        "--aa",
        action="store_true",
        help="A/A calibration: both sides run the raw code, so every ratio "
        "differs from 1.0 only by noise (no result file)",
    )
    parser.add_argument(
        "--dsn",
        help="PostgreSQL server (default: ENDPOINT_RUNTIME_DSN, PG* "
        "variables, else the embedded server); a throwaway database is used",
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, default in defaults.items():
        value = getattr(args, name)
        if value is None:
            setattr(args, name, default)
        elif value < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the result JSON as the last line of stdout.

    Args:
        argv: Arguments without the program name; ``None`` for ``sys.argv[1:]``.

    Returns:
        The process exit status.
    """
    args = parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    started = datetime.now(UTC)
    dsn = resolve_dsn(args.dsn)
    progress(
        f"server {redact_dsn(dsn) or '(PG* environment)'}: {args.messages} messages, "
        f"concurrency {args.concurrency}, {args.runs} runs"
    )
    if args.aa:
        progress("A/A calibration: both sides run the raw code")
    result = run_async(benchmark(dsn, args.messages, args.concurrency, args.runs, args.aa))
    result.update(
        benchmark="transport",
        aa_calibration=args.aa,
        mode="quick" if args.quick else "full",
        started_at=started.isoformat(timespec="seconds"),
        python_version=platform.python_version(),
        asyncpg_version=asyncpg.__version__,
        msgspec_version=msgspec.__version__,
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
    )
    if not (args.quick or args.aa):
        result["result_file"] = str(write_result("transport", result))
        progress(f"wrote {result['result_file']}")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
