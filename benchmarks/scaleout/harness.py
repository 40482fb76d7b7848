"""Runs sides in alternation and reduces their drains to medians, spreads and target ratios.

Every run drains each side once, in the same order, so that a slow minute of the shared
machine falls on all sides alike; a side's figure is the median of its runs, with the quartiles
and extremes beside it (:func:`benchmarks.common.summarize`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from benchmarks.common import median, progress, summarize
from benchmarks.scaleout.side import DrainResult, Load, Side

# The target ratios: (key, numerator side, denominator side).
TARGETS: tuple[tuple[str, str, str], ...] = (
    ("batched_vs_pgqueuer_best", "runtime_batched_50", "pgqueuer_best"),
    ("single_vs_pgqueuer_best", "runtime_single", "pgqueuer_best"),
    ("single_vs_procrastinate_default", "runtime_single", "procrastinate_default"),
    ("single_vs_lean_asyncpg", "runtime_single", "lean_asyncpg"),
    ("batched_vs_lean_asyncpg_batched", "runtime_batched_50", "lean_asyncpg_batched_50"),
    ("batched_vs_lean_asyncpg_optimistic", "runtime_batched_50", "lean_asyncpg_optimistic_50"),
    ("batched_failing_1pct_vs_batched", "runtime_batched_50_failing_1pct",
     "runtime_batched_50"),
    ("lean_failing_1pct_vs_lean_optimistic", "lean_asyncpg_optimistic_50_failing_1pct",
     "lean_asyncpg_optimistic_50"),
    ("batched_savepoint_vs_lean_asyncpg_batched", "runtime_batched_50_savepoint",
     "lean_asyncpg_batched_50"),
    ("single_vs_pgbench", "runtime_single", "pgbench"),
)

# What the issue wants of each target: (comparison, bound).
THRESHOLDS: dict[str, tuple[str, float]] = {
    "batched_vs_pgqueuer_best": (">=", 6.0),
    "single_vs_pgqueuer_best": (">=", 1.5),
    "single_vs_procrastinate_default": (">=", 5.0),
    "single_vs_lean_asyncpg": (">=", 0.95),
    "batched_vs_lean_asyncpg_batched": (">=", 0.85),
    "batched_vs_lean_asyncpg_optimistic": (">=", 0.85),
    "batched_failing_1pct_vs_batched": (">=", 0.5),
    "lean_failing_1pct_vs_lean_optimistic": (">=", 0.5),
    "batched_savepoint_vs_lean_asyncpg_batched": (">=", 0.85),
    "single_vs_pgbench": (">=", 0.75),
    "latency_p50_ms_at_50pct": ("<", 5.0),
    "latency_p99_ms_at_50pct": ("<", 25.0),
    "rss_growth_pct": ("<=", 10.0),
}


def target_met(key: str, value: float | None) -> bool | None:
    """Whether a measured target meets the issue's bound (None when it was not measured)."""
    if value is None:
        return None
    sign, bound = THRESHOLDS[key]
    return value >= bound if sign == ">=" else value < bound if sign == "<" else value <= bound


async def alternate(sides: Sequence[Side], dsn: str, load: Load, runs: int,
                    phase: str) -> dict[str, list[DrainResult]]:
    """Drain every side once per run, in the same order each run; the drains per side.

    A drain that fails or loses messages stops the benchmark: its figures would be wrong.
    """
    results: dict[str, list[DrainResult]] = {side.name: [] for side in sides}
    started = time.perf_counter()
    for run in range(1, runs + 1):
        for side in sides:
            result = await side.drain(dsn, load)
            if result.handled != load.messages or result.duplicates:
                raise RuntimeError(
                    f"{side.name} handled {result.handled} of {load.messages} messages "
                    f"with {result.duplicates} duplicates")
            results[side.name].append(result)
            progress(f"[{phase}] run {run}/{runs} {side.name:<28} "
                     f"{result.msgs_per_s:>9,.0f} msg/s  ({time.perf_counter() - started:.0f} s)")
    return results


def per_side(results: dict[str, list[DrainResult]]) -> dict[str, dict[str, Any]]:
    """Each side's median rate, its spread over the runs, its configuration, and the median
    of each further figure its drains report."""
    return {
        name: {"msgs_per_s": round(median([d.msgs_per_s for d in drains]), 1),
               "spread": {k: round(v, 1) for k, v in
                          summarize([d.msgs_per_s for d in drains]).items()},
               "config": drains[0].config, "runs": len(drains),
               **({"figures": median_figures(drains)} if drains[0].figures else {})}
        for name, drains in results.items() if drains
    }


def median_figures(drains: list[DrainResult]) -> dict[str, float]:
    """The median over the drains of each figure the first drain reports."""
    return {key: round(median([d.figures[key] for d in drains if key in d.figures]), 2)
            for key in drains[0].figures}


def paired_ratio(results: dict[str, list[DrainResult]], top: str, bottom: str) -> float | None:
    """The median over runs of ``top / bottom`` measured in the same run (None when a side
    did not run)."""
    if not results.get(top) or not results.get(bottom):
        return None
    pairs = [a.msgs_per_s / b.msgs_per_s
             for a, b in zip(results[top], results[bottom], strict=False) if b.msgs_per_s]
    return round(median(pairs), 3) if pairs else None


def target_ratios(results: dict[str, list[DrainResult]]) -> dict[str, float | None]:
    """The issue's target ratios, each the paired median of its two sides."""
    return {key: paired_ratio(results, top, bottom) for key, top, bottom in TARGETS}
