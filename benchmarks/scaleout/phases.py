"""The phases of ``python -m benchmarks.scaleout`` past the main drains: sweeps, latency
under load, notify_on_send on and off.

Every phase alternates its sides within each run (:func:`.harness.alternate`) and reports
medians; a phase point that fails (a load past the server's limits) is recorded and the rest
go on.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import median, progress
from benchmarks.scaleout.harness import alternate, per_side
from benchmarks.scaleout.lean_optimistic import LeanOptimisticSide
from benchmarks.scaleout.limits import LeanLoopSide, PgbenchSide
from benchmarks.scaleout.notify import NotifySide, notify_ratios
from benchmarks.scaleout.pgbench_sender import PgbenchSenderSide
from benchmarks.scaleout.runtime_sides import runtime_sides
from benchmarks.scaleout.side import Load, Side

LOADS = (0.5, 0.9)
"""Shares of a side's drain peak the latency phase sends at."""
LATENCY_TARGET_SIDE = "runtime_single_pgbench_sender"


def peer(name: str) -> Side:
    """One of the peers' sides by name (the peers need the bench extra, imported late)."""
    from benchmarks.scaleout.peers import peer_sides

    return next(side for side in peer_sides(quick=True) if side.name == name)


def drain_sides() -> list[Side]:
    """Every side of the drain phase, peers last (they take longest)."""
    from benchmarks.scaleout.peers import peer_sides

    return [*runtime_sides(), LeanLoopSide("lean_asyncpg"),
            LeanLoopSide("lean_asyncpg_batched_50", per_commit=50),
            LeanOptimisticSide("lean_asyncpg_optimistic_50"),
            LeanOptimisticSide("lean_asyncpg_optimistic_50_failing_1pct", failing=True),
            PgbenchSide(), *peer_sides(quick=True)]


def sweep_sides() -> list[Side]:
    """The sides of the sweeps: the runtime's two atomic modes, the lean loop, pgqueuer's best."""
    runtime = runtime_sides(batch_sizes=(50,), include=("single", "batched"))
    return [*runtime, LeanLoopSide("lean_asyncpg"), peer("pgqueuer_best")]


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


def latency_sides() -> list[tuple[Side, str]]:
    """The latency phase's sides, each with the drain side whose peak sets the Python
    sender's rates: the runtime's two atomic modes sent to by pgbench (the target's figures;
    their peak measured with sends and receives together), and the runtime's single-message
    mode and pgqueuer's best sent to by the Python sender (like with like, at shares of their
    drain peaks)."""
    single, batched = runtime_sides(batch_sizes=(50,), include=("single", "batched"))
    return [(PgbenchSenderSide(single), single.name), (PgbenchSenderSide(batched), batched.name),
            (single, single.name), (peer("pgqueuer_best"), "pgqueuer_best")]


async def side_peak(side: Side, peak_of: str, dsn: str, load: Load,
                    drain_peaks: dict[str, float], seconds: float) -> tuple[float, str]:
    """The rate a latency side's shares are taken of, and what it is."""
    if isinstance(side, PgbenchSenderSide):
        return await side.peak(dsn, load, seconds), "sends and receives together (pgbench)"
    if peak_of not in drain_peaks:
        drain_peaks[peak_of] = (await side.drain(dsn, load)).msgs_per_s
    return drain_peaks[peak_of], "drain"


async def latency(dsn: str, load: Load, drain_peaks: dict[str, float],
                  seconds: float) -> dict[str, Any]:
    """Each latency side at 50% and 90% of its peak: ``runs`` keyed ``side@share``, and the
    ``peaks`` they were taken of."""
    runs: dict[str, Any] = {}
    peaks: dict[str, Any] = {}
    for side, peak_of in latency_sides():
        peak, kind = await side_peak(side, peak_of, dsn, load, drain_peaks, seconds)
        peaks[side.name] = {"msgs_per_s": round(peak, 1), "kind": kind}
        for share in LOADS:
            result = await side.open_loop(dsn, load, peak * share, seconds)
            runs[f"{side.name}@{share:.0%}"] = result.as_json()
            progress(f"[latency] {side.name} at {share:.0%} of {peak:,.0f}/s ({kind}): sent "
                     f"{result.sent}, handled {result.handled}, to start "
                     f"{result.to_handler_start_ms}, to done {result.to_completion_ms}")
    return {"runs": runs, "peaks": peaks}


def latency_targets(measured: dict[str, Any]) -> dict[str, float | None]:
    """The issue's latency targets: the runtime's single-message mode at 50% of its peak,
    send to handler start (pgbench sending)."""
    at_half = measured["runs"].get(f"{LATENCY_TARGET_SIDE}@50%", {})
    start = at_half.get("to_handler_start_ms", {})
    return {"latency_p50_ms_at_50pct": start.get("p50"),
            "latency_p99_ms_at_50pct": start.get("p99")}


async def notify_phase(dsn: str, load: Load, senders: tuple[int, ...],
                       runs: int) -> dict[str, Any]:
    """notify_on_send on and off, alternating, at each count of senders."""
    sides = [NotifySide(on, count) for count in senders for on in (True, False)]
    measured = per_side(await alternate(sides, dsn, load, runs, "notify"))
    return {"sides": measured,
            "off_vs_on": {str(count): notify_ratios(measured, count) for count in senders}}
