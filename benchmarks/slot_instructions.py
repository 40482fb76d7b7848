"""Instructions per message of one receive slot and of the lean loop, counted by valgrind.

:mod:`benchmarks.slot_cpu` measures CPU time, which moves with whatever else a shared machine
runs (±30% between runs here). An instruction count does not: each side drains a backlog of
``--small`` and then of ``--large`` messages in a process of its own under ``valgrind
--tool=callgrind`` (the backlog filled by this process beforehand, outside the count), and the
difference of the two counts divided by the difference of the backlogs is the side's
instructions per message: start-up, imports and connecting cancel out. Counted are the
client process's user-space instructions (not the kernel's work for its round trips, which is
the same for both sides, nor the server's). Sides as in :mod:`benchmarks.slot_cpu`:
``runtime`` (one slot of the batched endpoint, 50, optimistic, one sink row per message) and
``lean`` (the same SQL, nothing around it); ``handlers_only``, the runtime's slot with only the
``invoke_handlers`` step in its chain (no log context, recoverability or metrics steps; not a
configuration anyone runs): its difference with ``runtime`` is what those steps cost.

Run ``python -m benchmarks.slot_instructions --dsn postgresql://postgres@127.0.0.1:5432/postgres``
(needs ``valgrind``: ``apt-get install valgrind``; about 6 minutes); prints one JSON object.
``--default-collector`` keeps Python's garbage collector settings in the drains instead of a
receiver's (:mod:`endpoint_runtime.runtime.collector`). The per-function counts stay in the
callgrind files named in the output (``callgrind_annotate FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.common import progress, run_async, run_benchmark, throwaway_database
from benchmarks.slot_cpu import QUEUE, create_tables, endpoint, fill, lean_side, runtime_side
from endpoint_runtime.connections.connecting import connect_pool
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.runtime.collector import tune_receiver_process
from endpoint_runtime.transactions.counting import counts_table, create_counts_table


async def handlers_only_side(pool: asyncpg.Pool, messages: int) -> float:
    """The runtime's slot with ``invoke_handlers`` alone in its chain."""
    return await runtime_side(pool, messages, only_steps={"invoke_handlers"})


SIDES = {"runtime": runtime_side, "lean": lean_side, "handlers_only": handlers_only_side}
_COLLECTED = re.compile(r"Collected : (\d+)")


async def drain(dsn: str, side: str, default_collector: bool) -> None:
    """The child: drain what the parent filled with ``side`` (run under valgrind)."""
    pool = await connect_pool(dsn, min_size=1, max_size=2)
    try:
        backlog = await pool.fetchval(f"SELECT count(*) FROM {QUEUE.qualified}")
        if not default_collector:
            tune_receiver_process()
        await SIDES[side](pool, backlog)
        left = await pool.fetchval(f"SELECT count(*) FROM {QUEUE.qualified}")
        if left:
            raise RuntimeError(f"{side}: {left} of {backlog} messages left")
    finally:
        await pool.close()


def counted(dsn: str, side: str, default_collector: bool, out: Path) -> int:
    """Instructions of one drain in a child process under callgrind."""
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
               "-m", "benchmarks.slot_instructions", "--drain", side, "--dsn", dsn]
    if default_collector:
        command.append("--default-collector")
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    found = _COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"the {side} drain under valgrind failed ({done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    return int(found[-1])


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    server = resolve_dsn(args.dsn)
    keep = Path(tempfile.mkdtemp(prefix="slot_instructions_"))
    figures: dict[str, Any] = {}
    async with throwaway_database(server, prefix="er_slot_instr") as database:
        dsn = with_database(server, database)
        pool = await connect_pool(dsn, min_size=1, max_size=2)
        try:
            await create_tables(pool)
            async with pool.acquire() as connection:  # made here: not in either count
                await create_counts_table(connection, counts_table(endpoint.address))
            for side in args.sides:
                counts = {}
                for backlog in (args.small, args.large):
                    await fill(pool, backlog)
                    out = keep / f"{side}-{backlog}.callgrind"
                    counts[backlog] = await asyncio.to_thread(
                        counted, dsn, side, args.default_collector, out)
                    progress(f"{side}, {backlog} messages: {counts[backlog]:,} instructions")
                per_message = (counts[args.large] - counts[args.small]) / (
                    args.large - args.small)
                figures[side] = round(per_message)
        finally:
            await pool.close()
    result: dict[str, Any] = {
        "benchmark": "slot_instructions", "backlogs": [args.small, args.large],
        "collector": "default" if args.default_collector else "receiver's",
        "instructions_per_message": figures, "callgrind_files": str(keep),
    }
    if "runtime" in figures and "lean" in figures:
        result["lean_vs_runtime_instructions"] = round(figures["lean"] / figures["runtime"], 3)
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.slot_instructions",
        description="instructions per message of a batched receive slot and the lean loop")
    parser.add_argument("--dsn", default=None, help="server DSN (default: the embedded one)")
    parser.add_argument("--sides", nargs="+", choices=sorted(SIDES), default=["runtime", "lean"])
    parser.add_argument("--small", type=int, default=300, help="the smaller backlog")
    parser.add_argument("--large", type=int, default=1300, help="the larger backlog")
    parser.add_argument("--default-collector", action="store_true",
                        help="keep Python's garbage collector settings (not a receiver's)")
    parser.add_argument("--drain", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.set_defaults(quick=False)  # the result is always kept in results/
    args = parser.parse_args(argv)
    if not 0 < args.small < args.large:
        parser.error("--small must be positive and below --large")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.drain:  # the child under valgrind
        run_async(drain(args.dsn, args.drain, args.default_collector))
        return
    run_benchmark("slot_instructions", parse, measure, argv)


if __name__ == "__main__":
    main()
