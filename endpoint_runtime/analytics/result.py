"""What a report run found and where it went (:class:`ReportResult`), and how its window reads.

Shared by the job that fills it and the rendering that draws it (neither imports the other's
module for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from endpoint_runtime.analytics.timeline import Point

if TYPE_CHECKING:
    from endpoint_runtime.analytics.options import ReportOptions

Row = dict[str, Any]


@dataclass
class ReportResult:
    """Where a report went and what it found (the figures of the page as plain rows)."""

    out: Path
    html: Path
    parquet: Path
    plots: dict[str, Path]
    audit_rows: int
    """Audit rows read from the database by this run."""
    error_rows: int
    read_partitions: dict[str, int]
    timings: dict[str, float]
    incremental: bool = True
    horizon: int | None = None
    """The extract's horizon after the run (``None``: ad-hoc)."""
    days: list[str] = field(default_factory=list)
    """The days this run (re)computed."""
    null_counts: dict[str, int] = field(default_factory=dict)
    """Rows with a NULL timestamp, per ``table.column`` (cumulative for an extract)."""
    summary: list[Row] = field(default_factory=list)
    exceptions: list[Row] = field(default_factory=list)
    edges: list[Row] = field(default_factory=list)
    slowest: list[Row] = field(default_factory=list)
    timeline: dict[str, list[Point]] = field(default_factory=dict)
    bucket_seconds: int = 60
    window: tuple[datetime, datetime] | None = None
    """First and last minute in the output."""


def describe_window(result: ReportResult, options: ReportOptions) -> str:
    def show(moment: datetime | None, default: str) -> str:
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else default

    if options.ad_hoc:
        return (f"from {show(options.since, 'the first row')} "
                f"until {show(options.until, 'now')}")
    if result.window is None:
        return "no data yet"
    return f"every minute the output holds: {show(result.window[0], '')} to " \
           f"{show(result.window[1], '')}"
