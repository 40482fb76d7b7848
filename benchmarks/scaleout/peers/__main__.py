"""Drain backlogs with the peer sides alone, in alternating rounds, and print JSON.

``python -m benchmarks.scaleout.peers --dsn postgresql://postgres@127.0.0.1:5432/postgres``
runs the four peer sides; ``--sweep pgqueuer`` (or ``procrastinate``) runs that library's
grid of configurations instead and names the best; ``--rate R`` adds an open-loop run per
side at R jobs a second. Every run uses a fresh database on the server, dropped after.
"""

from __future__ import annotations

import argparse
import platform
from typing import Any

from benchmarks.common import progress, run_benchmark, summarize
from benchmarks.scaleout.peers import peer_sides, pgqueuer_sweep, procrastinate_sweep
from benchmarks.scaleout.peers.sink import describe
from benchmarks.scaleout.side import Load, Side
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn

QUICK = {"messages": 2_000, "rounds": 2}
FULL = {"messages": 10_000, "rounds": 5}


def chosen_sides(args: argparse.Namespace) -> list[Side]:
    """The sweep's grid or the four peer sides, narrowed to ``--sides`` when given."""
    sides: list[Side] = list(
        pgqueuer_sweep() if args.sweep == "pgqueuer"
        else procrastinate_sweep() if args.sweep == "procrastinate"
        else peer_sides(args.quick))
    if args.sides:
        wanted = set(args.sides.split(","))
        unknown = wanted - {side.name for side in sides}
        if unknown:
            raise SystemExit(f"unknown sides: {', '.join(sorted(unknown))}")
        sides = [side for side in sides if side.name in wanted]
    return sides


async def drain_rounds(sides: list[Side], dsn: str, load: Load,
                       rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Each side drains once per round; odd rounds run the sides in reverse order."""
    runs: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
    for round_index in range(rounds):
        order = sides[::-1] if round_index % 2 else sides
        for side in order:
            result = await side.drain(dsn, load)
            runs[side.name].append(result.as_json())
            progress(f"round {round_index + 1}/{rounds} {side.name:28s} "
                     f"{result.msgs_per_s:8.0f} msg/s  handled {result.handled} "
                     f"duplicates {result.duplicates}  ({describe(side.config)})")
    return runs


def side_summary(runs: list[dict[str, Any]], messages: int) -> dict[str, Any]:
    rates = [run["msgs_per_s"] for run in runs]
    return {
        "msgs_per_s": summarize(rates),
        "per_run": rates,
        "all_handled_once": all(run["handled"] == messages and run["duplicates"] == 0
                                for run in runs),
        "config": runs[0]["config"],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    load = Load(messages=args.messages, concurrency=args.concurrency,
                body_bytes=args.body_bytes)
    sides = chosen_sides(args)
    runs = await drain_rounds(sides, server, load, args.rounds)
    summary = {name: side_summary(side_runs, load.messages) for name, side_runs in runs.items()}
    best = max(summary, key=lambda name: summary[name]["msgs_per_s"]["median"])
    latency = {}
    for side in sides if args.rate else ():
        result = await side.open_loop(server, load, args.rate, args.seconds)
        latency[side.name] = result.as_json()
        progress(f"open loop {side.name}: {result.handled}/{result.sent} at {args.rate}/s, "
                 f"to start {result.to_handler_start_ms}, to completion "
                 f"{result.to_completion_ms}")
    return {
        "benchmark": "scaleout-peers",
        "sweep": args.sweep,
        "load": {"messages": load.messages, "concurrency": load.concurrency,
                 "body_bytes": load.body_bytes},
        "rounds": args.rounds,
        "sides": summary,
        "best": best,
        "best_msgs_per_s": round(summary[best]["msgs_per_s"]["median"], 1),
        "latency": latency,
        "server": redact_dsn(server),
        "python": platform.python_version(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaleout.peers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run, result not kept")
    parser.add_argument("--dsn", help="PostgreSQL server (default: ENDPOINT_RUNTIME_DSN/embedded)")
    parser.add_argument("--messages", type=int, help="backlog per drain")
    parser.add_argument("--concurrency", type=int, default=4, help="jobs in flight")
    parser.add_argument("--body-bytes", type=int, default=100, help="body size of a job")
    parser.add_argument("--rounds", type=int, help="drains per side (medians reported)")
    parser.add_argument("--sides",
                        help="comma-separated side names (default: all four, or the grid)")
    parser.add_argument("--sweep", choices=("pgqueuer", "procrastinate"),
                        help="run the library's grid of configurations instead")
    parser.add_argument("--rate", type=float, help="also an open-loop run at this rate (/s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="open-loop duration")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


if __name__ == "__main__":
    run_benchmark("scaleout-peers", parse_args, main)
