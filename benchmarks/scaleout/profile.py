"""Where a runtime drain's time goes: a py-spy profile of the receiver, CPU per message of the
receiver and of PostgreSQL, and WAL flushes per message.

``python -m benchmarks.scaleout.profile --dsn DSN --side runtime_single --messages 30000``
deploys one of the runtime's sides (:func:`.runtime_sides.runtime_sides`), makes its backlog
visible, and while it drains samples the receiver with ``py-spy record --nonblocking`` (on-CPU
samples only, collapsed stacks). Then it reports:

- the receiver's and PostgreSQL's CPU microseconds per message (psutil; PostgreSQL's is every
  process of the server that listens on the DSN's port, which must run on this machine; other
  users of that server count too);
- WAL flushes and bytes per message (``pg_stat_wal``, PostgreSQL 14+; the whole server's);
- the receiver's on-CPU samples by package of the innermost frame (asyncpg, the runtime, Ray,
  msgspec, asyncio, the standard library...) and the top functions by own samples.

Where the receiver's CPU per message is near PostgreSQL's, the two compete for the same cores
(on this 2-core machine): that is the Python overhead a C client such as pgbench does not have.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from benchmarks.common import progress, run_async
from benchmarks.scaleout.costs import cpu_spent, postgres_cpu, receivers_cpu
from benchmarks.scaleout.runtime_sides import job_messages, runtime_sides, wait_for_rows
from benchmarks.scaleout.side import Load
from benchmarks.throughput import load_backlog
from endpoint_runtime.connections.embedded import resolve_dsn

PY_SPY = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "py-spy")
WAL = "SELECT wal_sync, wal_bytes::float8 AS wal_bytes FROM pg_stat_wal"
PACKAGES = ("asyncpg", "endpoint_runtime", "ray", "msgspec", "structlog", "asyncio",
            "benchmarks")


def postmaster_on(port: int) -> psutil.Process:
    """The PostgreSQL server process listening on ``port`` on this machine."""
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port \
                and connection.pid:
            return psutil.Process(connection.pid)
    raise LookupError(f"no process of this machine listens on port {port}")


def package(frame: str) -> str:
    """The package a py-spy frame (``function (path:line)``) belongs to."""
    path = frame.rsplit("(", 1)[-1]
    for name in PACKAGES:
        if f"/{name}/" in path or f"{name}/" in path.split("site-packages/")[-1][:40]:
            return name
    return "other (standard library, C)" if "/python3" in path else "other"


def summarize_stacks(raw: str, top: int = 15) -> dict[str, Any]:
    """py-spy's collapsed stacks (``frame;frame;... count``) as shares of the samples by
    the innermost frame's package, and the ``top`` innermost functions."""
    by_package: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.split(";")[-1]
        by_package[package(leaf)] += int(count)
        by_function[re.sub(r":\d+\)$", ")", leaf)] += int(count)
    total = sum(by_package.values()) or 1
    return {"samples": total,
            "by_package_pct": {k: round(100 * v / total, 1) for k, v in by_package.most_common()},
            "top_functions_pct": {k: round(100 * v / total, 1)
                                  for k, v in by_function.most_common(top)}}


async def profile(dsn: str, side_name: str, load: Load) -> dict[str, Any]:
    """Drain ``load`` with the named runtime side under py-spy; the figures above."""
    side = next(s for s in runtime_sides() if s.name == side_name)
    postmaster = postmaster_on(urlsplit(dsn).port or 5432)
    async with side.deployed(dsn, load) as running:
        messages = job_messages(load.messages, load.body_bytes, running.clock)
        pids = [r.pid for r in (await running.deployment.status(refresh=True)).receivers]
        output = Path(tempfile.mkdtemp(prefix="er-scaleout-spy-")) / "stacks.txt"
        spy = await asyncio.create_subprocess_exec(
            PY_SPY, "record", "--pid", str(pids[0]), "--rate", "200", "--nonblocking",
            "--format", "raw", "--output", str(output),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # py-spy attached before the backlog shows
        wal = await running.pool.fetchrow(WAL)
        cpu = (receivers_cpu(pids), postgres_cpu(postmaster))
        visible = await load_backlog(running.pool, running.queue, messages)
        done = await wait_for_rows(running.pool, load.messages, 60 + load.messages / 50)
        spent = (cpu_spent(cpu[0], receivers_cpu(pids)),
                 cpu_spent(cpu[1], postgres_cpu(postmaster)))
        wal_after = await running.pool.fetchrow(WAL)
        spy.send_signal(signal.SIGINT)
        await spy.wait()
    per = 1e6 / load.messages
    flushes = wal_after["wal_sync"] - wal["wal_sync"]
    return {"side": side_name, "messages": load.messages, "concurrency": load.concurrency,
            "msgs_per_s": round(load.messages / (done - visible), 1),
            "receiver_cpu_us_per_msg": round(spent[0] * per, 1),
            "postgres_cpu_us_per_msg": round(spent[1] * per, 1),
            "wal_flushes_per_msg": round(flushes / load.messages, 3),
            "wal_bytes_per_msg": round((wal_after["wal_bytes"] - wal["wal_bytes"]) / load.messages),
            "receiver_profile": summarize_stacks(output.read_text() if output.exists() else ""),
            "load_average": round(psutil.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> None:
    import logging

    import structlog

    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaleout.profile",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="the server (default: the embedded PostgreSQL)")
    parser.add_argument("--side", default="runtime_single",
                        help="runtime_single, runtime_batched_50, ...")
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    started = time.perf_counter()
    result = run_async(profile(resolve_dsn(args.dsn), args.side,
                                 Load(args.messages, args.concurrency)))
    progress(f"profiled {args.side} in {time.perf_counter() - started:.0f} s")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
