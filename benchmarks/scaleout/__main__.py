"""``python -m benchmarks.scaleout``: this runtime beside its peers and the database's limit.

Phases (``--phases``, all by default):

- ``drains``: every side drains the same backlog at concurrency 4, in alternating runs: the
  runtime's single-message, batched (10, 50, 200), receive-only and outbox modes; pgqueuer and
  procrastinate, default and tuned (:mod:`.peers`); the leanest asyncpg loop (one and 50
  messages per commit) and pgbench (:mod:`.limits`). The issue's target ratios come from here.
- ``concurrency``: the main sides at concurrency 1, 4, 16 (and 64 in a full run).
- ``sizes``: the main sides with 100 B, 10 KB and 1 MB bodies.
- ``latency``: an open-loop sender at 50% and 90% of each side's drain peak (from ``drains``,
  else one drain first); send-to-handler-start and send-to-completion p50/p95/p99.

Not built yet (docs/performance.md says so): the endurance drain, the nodes sweep and
notify_on_send on/off. The last stdout line is the result as JSON; progress
goes to stderr; plots and the result file go to benchmarks/results/; ``--write-docs`` puts the
drain table into docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

import structlog

from benchmarks.common import RESULTS_DIR, median, progress, provenance, write_result
from benchmarks.scaleout import report
from benchmarks.scaleout.harness import alternate, per_side, target_ratios
from benchmarks.scaleout.limits import LeanLoopSide, PgbenchSide
from benchmarks.scaleout.runtime_sides import runtime_sides
from benchmarks.scaleout.side import Load, Side
from endpoint_runtime.embedded import redact_dsn, resolve_dsn

PHASES = ("drains", "concurrency", "sizes", "latency")
QUICK = {"messages": 4_800, "runs": 3, "concurrency": (1, 4, 16), "sweep_runs": 1,
         "sizes": {100: 4_800, 10_000: 1_600, 1_000_000: 48}, "latency_s": 8.0}
FULL = {"messages": 9_600, "runs": 5, "concurrency": (1, 4, 16, 64), "sweep_runs": 3,
        "sizes": {100: 9_600, 10_000: 3_200, 1_000_000: 192}, "latency_s": 20.0}
LATENCY_SIDES = ("runtime_single", "runtime_batched_50", "pgqueuer_best")
LOADS = (0.5, 0.9)


def drain_sides() -> list[Side]:
    """Every side of the drain phase, peers last (they take longest)."""
    from benchmarks.scaleout.peers import peer_sides

    return [*runtime_sides(), LeanLoopSide("lean_asyncpg"),
            LeanLoopSide("lean_asyncpg_batched_50", per_commit=50), PgbenchSide(),
            *peer_sides(quick=True)]


def sweep_sides() -> list[Side]:
    """The sides of the sweeps: the runtime's two atomic modes and the two limits' loops."""
    from benchmarks.scaleout.peers import peer_sides

    runtime = [s for s in runtime_sides(batch_sizes=(50,), include=("single", "batched"))]
    pgqueuer = [s for s in peer_sides(quick=True) if s.name == "pgqueuer_best"]
    return [*runtime, LeanLoopSide("lean_asyncpg"), *pgqueuer]


async def sweep(dsn: str, points: dict[int, Load], runs: int, phase: str) -> dict[str, Any]:
    """Each point's load drained by the sweep's sides; medians per side and point."""
    by_side: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for point, load in points.items():
        try:
            results = await alternate(sweep_sides(), dsn, load, runs, f"{phase} {point}")
        except Exception as exc:  # a point past the server's limits: recorded, not fatal
            errors[str(point)] = f"{type(exc).__name__}: {exc}"
            progress(f"[{phase} {point}] failed: {errors[str(point)]}")
            continue
        for name, drains in results.items():
            by_side.setdefault(name, {})[str(point)] = round(
                median([d.msgs_per_s for d in drains]), 1)
    return {"by_side": by_side, "errors": errors,
            "loads": {str(p): vars(load) for p, load in points.items()}}


async def latency(dsn: str, load: Load, peaks: dict[str, float],
                  seconds: float) -> dict[str, Any]:
    """Each latency side at 50% and 90% of its peak (measured here when ``peaks`` lacks it)."""
    sides = {side.name: side for side in [*drain_sides()] if side.name in LATENCY_SIDES}
    measured: dict[str, Any] = {}
    for name, side in sides.items():
        peak = peaks.get(name) or (await side.drain(dsn, load)).msgs_per_s
        for share in LOADS:
            result = await side.open_loop(dsn, load, peak * share, seconds)
            measured[f"{name}@{share:.0%}"] = result.as_json()
            progress(f"[latency] {name} at {share:.0%} of {peak:,.0f}/s: sent {result.sent}, "
                     f"to start {result.to_handler_start_ms}, to done {result.to_completion_ms}")
    return measured


async def main(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK if args.quick else FULL
    dsn = resolve_dsn(args.dsn)
    runs = args.runs or plan["runs"]
    load = Load(messages=args.messages or plan["messages"], concurrency=4)
    result: dict[str, Any] = {"benchmark": "scaleout", "quick": args.quick, "runs": runs,
                              "server": redact_dsn(dsn), "load": vars(load), "phases": {}}
    if "drains" in args.phases:
        drains = await alternate(drain_sides(), dsn, load, runs, "drains")
        result["phases"]["drains"] = {"sides": per_side(drains)}
        result["targets"] = target_ratios(drains)
    if "concurrency" in args.phases:
        points = {c: Load(load.messages, c) for c in plan["concurrency"]}
        result["phases"]["concurrency"] = await sweep(dsn, points, plan["sweep_runs"],
                                                      "concurrency")
    if "sizes" in args.phases:
        points = {size: Load(count, 4, size) for size, count in plan["sizes"].items()}
        result["phases"]["sizes"] = await sweep(dsn, points, plan["sweep_runs"], "sizes")
    if "latency" in args.phases:
        peaks = {name: side["msgs_per_s"] for name, side in
                 result["phases"].get("drains", {}).get("sides", {}).items()}
        measured = await latency(dsn, load, peaks, plan["latency_s"])
        result["phases"]["latency"] = measured
        at_half = measured.get("runtime_single@50%", {}).get("to_handler_start_ms", {})
        result.setdefault("targets", {}).update(
            latency_p50_ms_at_50pct=at_half.get("p50"), latency_p99_ms_at_50pct=at_half.get("p99"))
    result["not_measured"] = ["rss_growth_pct", "nodes", "notify_on_send"]
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaleout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer runs and points")
    parser.add_argument("--dsn", help="the server (default: the embedded PostgreSQL)")
    parser.add_argument("--runs", type=int, help="alternating runs of the drain phase")
    parser.add_argument("--messages", type=int, help="backlog per drain (a multiple of 64)")
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--write-docs", action="store_true",
                        help="put the drain table into docs/performance.md")
    args = parser.parse_args(argv)
    if args.messages is not None and args.messages % 64:
        parser.error("--messages must be a multiple of 64 (pgbench splits it over clients)")
    return args


def run(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = {**asyncio.run(main(args)), **provenance()}
    path = write_result("scaleout", result)
    plots = report.plot(result, RESULTS_DIR) if "drains" in result["phases"] else []
    progress(f"wrote {path} and {', '.join(str(p) for p in plots) or 'no plot'}")
    if args.write_docs and "drains" in result["phases"]:
        report.write_table(result)
        progress(f"wrote the drain table into {report.DOCS}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run()
