"""Per-minute series as small SVG polylines (pure): the endpoints page's charts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

MINUTES = 60
WIDTH = 120
HEIGHT = 28


class Series(msgspec.Struct, frozen=True):
    """One value per minute, oldest first, and the polyline's points; ``samples``: the
    minutes that had a row (0: nothing to draw, which is not a flat zero)."""

    values: list[float]
    peak: float
    points: str
    samples: int = 0


def series(rows: Iterable[Mapping[str, Any]] | Iterable[Any], now: datetime,
           field: str) -> Series:
    """``rows`` have ``minute`` (truncated to the minute) and ``field``; minutes without a
    row are 0. The last point is the current minute."""
    last = now.replace(second=0, microsecond=0)
    first = last - timedelta(minutes=MINUTES - 1)
    values = [0.0] * MINUTES
    samples = 0
    for row in rows:
        index = int((row["minute"] - first).total_seconds() // 60)
        if 0 <= index < MINUTES and row[field] is not None:
            values[index] = float(row[field])
            samples += 1
    peak = max(values)
    scale = (HEIGHT - 2) / peak if peak else 0.0
    step = WIDTH / (MINUTES - 1)
    points = " ".join(f"{i * step:.1f},{HEIGHT - 1 - v * scale:.1f}"
                      for i, v in enumerate(values))
    return Series(values=values, peak=peak, points=points, samples=samples)
