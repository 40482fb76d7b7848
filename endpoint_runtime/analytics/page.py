"""The HTML page of a report: one self-contained file beside its ``plots/`` folder, readable
from disk in any browser (no server, no script), and served by the console (``--report``).
Rendered from ``templates/report.html`` with the templates the console's pages use
(:mod:`endpoint_runtime.pages`: autoescaped, control characters shown): endpoint names and
exception messages come from the wire. Here the figures become text; escaping is the
templates'."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from markupsafe import escape

from endpoint_runtime.analytics.units import duration, rate
from endpoint_runtime.pages import environment, moment, visible

Row = Mapping[str, Any]
TEMPLATES = environment(Path(__file__).parent / "templates")


def esc(value: object) -> str:
    """Text from the data as HTML: escaped, control characters shown as ``\\xNN`` (what the
    templates do to every cell)."""
    return str(escape(visible(value)))


def ms(value: object) -> str:
    return "-" if value is None else duration(float(value))  # type: ignore[arg-type]


def number(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def percent(value: object) -> str:
    return "-" if value is None else f"{float(value) * 100:.2f} %"  # type: ignore[arg-type]


def summary_cells(rows: Sequence[Row]) -> tuple[list[list[str]], list[str]]:
    """The summary table's cells (text) and its rows' classes (``total``: an endpoint's
    line over all its types)."""
    cells, classes = [], []
    for row in rows:
        total = row["message_type"] is None
        classes.append("total" if total else "")
        cells.append([
            row["endpoint"] if total else "",
            "all types" if total else row["message_type"],
            number(row["processed"]), number(row["failed"]), percent(row["failure_rate"]),
            rate(float(row["per_second"] or 0.0)), number(row["retries"]),
            *(ms(row[f"processing_ms_{p}"]) for p in ("p50", "p95", "p99")),
            *(ms(row[f"critical_ms_{p}"]) for p in ("p50", "p95", "p99")),
            ms(row.get("wait_ms_p95")),
        ])
    return cells, classes


def render(*, title: str, window: str, generated: datetime, facts: Sequence[tuple[str, str]],
           summary: Sequence[Row], exceptions: Sequence[Row], edges: Sequence[Row],
           slowest: Sequence[Row], plots: Mapping[str, str]) -> str:
    """The page; ``plots`` maps a caption to the PNG's path relative to the page."""
    summary_rows, summary_classes = summary_cells(summary)
    return TEMPLATES.get_template("report.html").render(
        title=title, window=window, generated=generated, plots=plots,
        facts=[list(fact) for fact in facts],
        summary=summary_rows, summary_classes=summary_classes,
        exceptions=[[r["endpoint"], r["exception_type"], r["exception_message"],
                     number(r["count"]), moment(r["first_seen"]), moment(r["last_seen"]),
                     ", ".join(r["message_types"] or [])] for r in exceptions],
        edges=[[r["sender"], r["receiver"], r["message_type"], number(r["messages"]),
                ms(r["latency_ms_p50"]), ms(r["latency_ms_p95"]), ms(r["latency_ms_p99"])]
               for r in edges],
        slowest=[[r["conversation_id"], r["initiating_type"], r["initiating_endpoint"],
                  moment(r["started"]), ms(r["duration_ms"]), number(r["messages"]),
                  number(r["retries"]), number(r["failed"]), ", ".join(r["endpoints"] or [])]
                 for r in slowest])
