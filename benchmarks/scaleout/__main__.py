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
- ``notify``: closed-loop senders beside a deployment, ``notify_on_send`` on and off
  (:mod:`.notify`).
- ``endurance``: a backlog of 1,000,000 messages (100,000 quick) drained by one deployment with
  its receivers' RSS sampled (:mod:`.endurance`); ``rss_growth_pct`` after warm-up.
- ``nodes``: 1, 2 and 3 Ray nodes started on this machine, receivers per node (:mod:`.nodes`).

The last stdout line is the result as JSON, the target ratios under ``targets``; progress goes
to stderr; plots and the result file go to benchmarks/results/; ``--write-docs`` puts the tables
into docs/performance.md and the plots into docs/images/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any

import structlog

from benchmarks.common import RESULTS_DIR, progress, provenance, run_async, write_result
from benchmarks.scaleout import plots, report
from benchmarks.scaleout.endurance import endurance
from benchmarks.scaleout.harness import alternate, per_side, target_ratios
from benchmarks.scaleout.nodes import nodes_sweep
from benchmarks.scaleout.phases import (
    drain_sides,
    latency,
    latency_targets,
    notify_phase,
    sweep,
)
from benchmarks.scaleout.side import Load
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn

DOCS_IMAGES = report.DOCS.parent / "images"
PHASES = ("drains", "concurrency", "sizes", "latency", "notify", "endurance", "nodes")
QUICK = {"messages": 4_800, "runs": 3, "concurrency": (1, 4, 16), "sweep_runs": 1,
         "sizes": {100: 4_800, 10_000: 1_600, 1_000_000: 48}, "latency_s": 6.0,
         "notify_senders": (16,), "notify_runs": 2, "endurance": 100_000,
         "nodes": (1, 2, 3), "per_node": (1, 2), "nodes_messages": 4_800}
FULL = {"messages": 9_600, "runs": 5, "concurrency": (1, 4, 16, 64), "sweep_runs": 3,
        "sizes": {100: 9_600, 10_000: 3_200, 1_000_000: 192}, "latency_s": 20.0,
        "notify_senders": (4, 16), "notify_runs": 3, "endurance": 1_000_000,
        "nodes": (1, 2, 3), "per_node": (1, 2, 4), "nodes_messages": 9_600}

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
        result.setdefault("targets", {}).update(latency_targets(measured))
    if "notify" in args.phases:
        result["phases"]["notify"] = await notify_phase(dsn, load, plan["notify_senders"],
                                                        plan["notify_runs"])
    if "endurance" in args.phases:
        measured = await endurance(dsn, args.endurance or plan["endurance"])
        result["phases"]["endurance"] = measured
        result.setdefault("targets", {})["rss_growth_pct"] = measured["rss_growth_pct"]
    if "nodes" in args.phases:
        result["phases"]["nodes"] = await nodes_sweep(
            dsn, plan["nodes_messages"], plan["nodes"], plan["per_node"], plan["sweep_runs"])
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaleout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer runs and points")
    parser.add_argument("--dsn", help="the server (default: the embedded PostgreSQL)")
    parser.add_argument("--runs", type=int, help="alternating runs of the drain phase")
    parser.add_argument("--messages", type=int, help="backlog per drain (a multiple of 64)")
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--endurance", type=int, help="backlog of the endurance drain")
    parser.add_argument("--write-docs", action="store_true",
                        help="put the tables into docs/performance.md, the plots into "
                        "docs/images/")
    args = parser.parse_args(argv)
    if args.messages is not None and args.messages % 64:
        parser.error("--messages must be a multiple of 64 (pgbench splits it over clients)")
    return args


def run(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # The receivers' info lines (one per start and stop) would bury the progress lines; Ray
    # workers inherit this process's environment.
    os.environ.setdefault("ENDPOINT_RUNTIME_LOG_LEVEL", "warning")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    started = round(os.getloadavg()[0], 2)
    result = {**run_async(main(args)), **provenance()}
    result["load_average"] = {"start": started, "end": round(os.getloadavg()[0], 2)}
    path = write_result("scaleout", result)
    written = plots.plot(result, RESULTS_DIR)
    progress(f"wrote {path} and {', '.join(str(p) for p in written) or 'no plot'}")
    if args.write_docs:
        report.write_table(result)
        plots.plot(result, DOCS_IMAGES)
        progress(f"wrote the tables into {report.DOCS} and the plots into {DOCS_IMAGES}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    run()
