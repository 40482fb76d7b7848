"""Python bytecodes per message of one receive slot and of the lean loop, by file and function.

:mod:`benchmarks.slot_instructions` says how many instructions a message costs;
this says where, in Python's terms: each side of :mod:`benchmarks.slot_cpu` (and
``handlers_only`` of :mod:`benchmarks.slot_instructions`) drains ``--messages`` messages in
this process under ``sys.settrace`` with opcode events, and every bytecode executed is
counted against its code object's file and function. Both sides run the same asyncio and
asyncpg code for their round trips, so the files that only the runtime side has are what it
adds. Tracing slows the drains about tenfold, and counts do not depend on the machine's load
(they move slightly with how often the event loop finds a reply not yet there).

Run ``python -m benchmarks.slot_bytecodes --dsn postgresql://postgres@127.0.0.1:5432/postgres``
(about a minute); prints one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.common import progress, run_benchmark, throwaway_database
from benchmarks.slot_cpu import create_tables, endpoint, fill
from benchmarks.slot_instructions import SIDES
from endpoint_runtime.connections.connecting import connect_pool
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.runtime.collector import tune_receiver_process
from endpoint_runtime.transactions.counting import counts_table, create_counts_table

TOP = 30
"""Functions listed per side."""
ROOT = Path(__file__).resolve().parents[1]


class OpcodeCounter:
    """Bytecodes executed per (file, function) while installed with ``sys.settrace``."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            self.counts[(code.co_filename, code.co_name)] += 1
        return self.trace


def short(filename: str) -> str:
    """A file's name from its package on (``asyncio/base_events.py``, ``asyncpg/pool.py``)."""
    parts = Path(filename).parts
    for anchor in ("site-packages", "python3.11"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    path = Path(filename)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else filename


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    figures: dict[str, Any] = {}
    async with throwaway_database(server, prefix="er_slot_bytecodes") as database:
        pool = await connect_pool(with_database(server, database), min_size=1, max_size=2)
        try:
            await create_tables(pool)
            async with pool.acquire() as connection:
                await create_counts_table(connection, counts_table(endpoint.address))
            tune_receiver_process()
            for side in args.sides:
                await fill(pool, args.messages)
                counter = OpcodeCounter()
                sys.settrace(counter.trace)
                try:
                    await SIDES[side](pool, args.messages)
                finally:
                    sys.settrace(None)
                by_file: collections.Counter[str] = collections.Counter()
                for (filename, _), count in counter.counts.items():
                    by_file[short(filename)] += count
                per = args.messages
                figures[side] = {
                    "bytecodes_per_message": round(sum(counter.counts.values()) / per),
                    "by_file": {name: round(count / per, 1)
                                for name, count in by_file.most_common() if count >= per},
                    "top_functions": {f"{short(filename)}:{function}": round(count / per, 1)
                                      for (filename, function), count
                                      in counter.counts.most_common(TOP)},
                }
                progress(f"{side}: {figures[side]['bytecodes_per_message']} bytecodes "
                         f"per message")
        finally:
            await pool.close()
    result: dict[str, Any] = {"benchmark": "slot_bytecodes", "messages": args.messages,
                              "sides": figures}
    if "runtime" in figures and "lean" in figures:
        lean = set(figures["lean"]["by_file"])
        result["runtime_only_files"] = {
            name: count for name, count in figures["runtime"]["by_file"].items()
            if name not in lean}
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.slot_bytecodes",
        description="bytecodes per message of a batched receive slot and the lean loop")
    parser.add_argument("--dsn", default=None, help="server DSN (default: the embedded one)")
    parser.add_argument("--sides", nargs="+", choices=sorted(SIDES),
                        default=["runtime", "handlers_only", "lean"])
    parser.add_argument("--messages", type=int, default=2_000, help="backlog per side")
    parser.add_argument("--quick", action="store_true",
                        help="500 messages, result not kept in results/")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = 500
    if args.messages < 1:
        parser.error("--messages must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    run_benchmark("slot_bytecodes", parse, measure, argv)


if __name__ == "__main__":
    main()
