"""The report's page, plots and ``summary.json`` from a run's figures."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from endpoint_runtime.analytics import plots
from endpoint_runtime.analytics.page import render
from endpoint_runtime.analytics.result import ReportResult, describe_window

if TYPE_CHECKING:
    from endpoint_runtime.analytics.options import ReportOptions

TITLE = "endpoint-runtime report"


def render_report(options: ReportOptions, result: ReportResult) -> None:
    directory = result.out / "plots"
    if directory.exists():
        shutil.rmtree(directory)
    result.plots = plots.draw_all(result.timeline, result.edges, result.bucket_seconds,
                                  directory)
    window = describe_window(result, options)
    facts = [("window", window),
             ("run", "incremental: the rows new since the last run" if result.incremental
              else "ad-hoc window (no horizon kept)"),
             ("audit rows read", f"{result.audit_rows:,}"),
             ("failed messages read", f"{result.error_rows:,}"),
             ("days recomputed", ", ".join(result.days) or "none"),
             ("Parquet (partitioned by day)", str(result.parquet))]
    for key, count in sorted(result.null_counts.items()):
        facts.append((f"rows with NULL {key}", f"{count:,}"))
    result.html.parent.mkdir(parents=True, exist_ok=True)
    result.html.write_text(render(
        title=TITLE, window=window, generated=datetime.now(UTC), facts=facts,
        summary=result.summary, exceptions=result.exceptions, edges=result.edges[:100],
        slowest=result.slowest,
        plots={caption: str(path.relative_to(result.out))
               for caption, path in result.plots.items()},
    ), encoding="utf-8")
    summary = {"window": window, "audit_rows": result.audit_rows,
               "error_rows": result.error_rows, "incremental": result.incremental,
               "horizon": result.horizon, "days": result.days,
               "null_counts": result.null_counts, "endpoints": result.summary,
               "exceptions": result.exceptions, "edges": result.edges,
               "slowest_conversations": result.slowest}
    (result.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str),
                                             encoding="utf-8")
