"""Figures in human units, for the page and the plots: durations in ms, s, min or h,
rates in messages per second, minute or hour, counts with k and M."""

from __future__ import annotations

import math


def duration(ms: float) -> str:
    """``850 ms``, ``1.2 s``, ``3.5 min``, ``2.1 h``."""
    if ms is None or math.isnan(ms):
        return "-"
    if ms < 1:
        return f"{ms:.2g} ms"
    if ms < 1000:
        return f"{ms:.3g} ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:.3g} min"
    return f"{ms / 3_600_000:.3g} h"


def rate(per_second: float) -> str:
    """``1,234 msg/s``, ``2.5 msg/s``, ``12 msg/min``, ``3 msg/h``."""
    if per_second is None or math.isnan(per_second) or per_second == 0:
        return "0"
    if per_second >= 100:
        return f"{per_second:,.0f} msg/s"
    if per_second >= 1:
        return f"{per_second:.3g} msg/s"
    if per_second * 60 >= 1:
        return f"{per_second * 60:.3g} msg/min"
    return f"{per_second * 3600:.3g} msg/h"


def count(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.3g}M"
    if value >= 10_000:
        return f"{value / 1000:.3g}k"
    return f"{value:,.0f}"
