"""Recovery times after faults: how long the handling rate took to come back (pure)."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

RECOVERY_SHARE = 0.9
BASELINE_SECONDS = 3.0
WINDOW_SECONDS = 1.0
STEP_SECONDS = 0.1


def recovery_times(effect_times: Sequence[float], faults: Sequence[float]) -> list[float | None]:
    """Seconds from each fault until throughput is back to 90% of what it was before.

    Throughput before: effects per second over the :data:`BASELINE_SECONDS` before the fault.
    Back: the first moment ``t`` (in steps of 0.1 s) from which the next second holds at
    least 90% of that rate. ``None``: not back before the effects end. ``0.0``: no dip (or
    nothing flowed before the fault).

    Args:
        effect_times: Sorted epoch seconds of the committed effects.
        faults: Epoch seconds of the faults.
    """
    def count(start: float, end: float) -> int:
        return bisect.bisect_left(effect_times, end) - bisect.bisect_left(effect_times, start)

    last = effect_times[-1] if effect_times else 0.0
    times: list[float | None] = []
    for at in faults:
        baseline = count(at - BASELINE_SECONDS, at) / BASELINE_SECONDS
        wanted = RECOVERY_SHARE * baseline * WINDOW_SECONDS
        found: float | None = None
        t = at
        while t + WINDOW_SECONDS <= last:
            if count(t, t + WINDOW_SECONDS) >= wanted:
                found = round(t - at, 1)
                break
            t += STEP_SECONDS
        times.append(0.0 if baseline == 0 else found)
    return times


def summarize_recovery(by_kind: dict[str, list[float | None]]) -> dict[str, object]:
    """Per fault kind: every recovery time, their median and maximum, and how many never
    came back before the end of the run."""
    summary: dict[str, object] = {}
    for kind, values in by_kind.items():
        known = [v for v in values if v is not None]
        summary[kind] = {
            "each": values,
            "median": statistics.median(known) if known else None,
            "max": max(known) if known else None,
            "not_recovered": len(values) - len(known),
        }
    return summary
