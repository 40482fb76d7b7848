"""The HTML page of a report: one self-contained file beside its ``plots/`` folder, readable
from disk in any browser (no server, no script). Everything that comes from the data is
escaped: endpoint names and exception messages come from the wire."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from endpoint_runtime.analytics.units import duration, rate

Row = Mapping[str, Any]
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: 13px; }
th, td { padding: .25em .6em; border-bottom: 1px solid #eee; text-align: right; }
th { background: #f4f6f9; } td.t, th.t { text-align: left; }
tr.total td { font-weight: 600; background: #fafbfd; }
img { max-width: 100%; border: 1px solid #eee; margin: .5em 0; }
.muted { color: #777; } code { font-size: 12px; }
"""


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def esc(value: object) -> str:
    """Text from the data as HTML: escaped, control characters shown as ``\\xNN``."""
    text = "" if value is None else str(value)
    return html.escape(_CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text))


def ms(value: object) -> str:
    return "-" if value is None else duration(float(value))  # type: ignore[arg-type]


def number(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return esc(value)


def percent(value: object) -> str:
    return "-" if value is None else f"{float(value) * 100:.2f} %"  # type: ignore[arg-type]


def moment(value: object) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else esc(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1,
          classes: Sequence[str] | None = None, text_last: bool = False) -> str:
    """Cells arrive escaped (or formatted); the first ``text_columns`` (and the last, with
    ``text_last``) align left, numbers right."""
    if not rows:
        return '<p class="muted">none</p>'
    left = {*range(text_columns), *([len(headers) - 1] if text_last else [])}
    head = "".join(f'<th class="{"t" if i in left else ""}">{esc(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    for index, row in enumerate(rows):
        css = f' class="{classes[index]}"' if classes and classes[index] else ""
        cells = "".join(f'<td class="{"t" if i in left else ""}">{cell}</td>'
                        for i, cell in enumerate(row))
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def summary_table(rows: Sequence[Row]) -> str:
    cells, classes = [], []
    for row in rows:
        total = row["message_type"] is None
        classes.append("total" if total else "")
        cells.append([
            esc(row["endpoint"]) if total else "",
            "all types" if total else esc(row["message_type"]),
            number(row["processed"]), number(row["failed"]), percent(row["failure_rate"]),
            esc(rate(float(row["per_second"] or 0.0))), number(row["retries"]),
            *(ms(row[f"processing_ms_{p}"]) for p in ("p50", "p95", "p99")),
            *(ms(row[f"critical_ms_{p}"]) for p in ("p50", "p95", "p99")),
            ms(row.get("wait_ms_p95")),
        ])
    return table(["endpoint", "message type", "processed", "failed", "failure rate",
                  "throughput", "retries", "proc p50", "proc p95", "proc p99", "crit p50",
                  "crit p95", "crit p99", "wait p95"], cells, text_columns=2, classes=classes)


def render(*, title: str, window: str, generated: datetime, facts: Sequence[tuple[str, str]],
           summary: Sequence[Row], exceptions: Sequence[Row], edges: Sequence[Row],
           slowest: Sequence[Row], plots: Mapping[str, str]) -> str:
    """The page; ``plots`` maps a caption to the PNG's path relative to the page."""
    # Each plot carries its title: the caption is its alt text only.
    images = "".join(f'<img src="{esc(src)}" alt="{esc(caption)}">'
                     for caption, src in plots.items())
    fact_rows = [[esc(name), esc(value)] for name, value in facts]
    exception_rows = [[esc(r["endpoint"]), esc(r["exception_type"]), esc(r["exception_message"]),
                       number(r["count"]), moment(r["first_seen"]), moment(r["last_seen"]),
                       esc(", ".join(r["message_types"] or []))] for r in exceptions]
    edge_rows = [[esc(r["sender"]), esc(r["receiver"]), esc(r["message_type"]),
                  number(r["messages"]), ms(r["latency_ms_p50"]),
                  ms(r["latency_ms_p95"]), ms(r["latency_ms_p99"])] for r in edges]
    conversation_rows = [[esc(r["conversation_id"]), esc(r["initiating_type"]),
                          esc(r["initiating_endpoint"]), moment(r["started"]),
                          ms(r["duration_ms"]), number(r["messages"]),
                          number(r["retries"]), number(r["failed"]),
                          esc(", ".join(r["endpoints"] or []))] for r in slowest]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{esc(title)}</h1>
<p class="muted">{esc(window)} &middot; generated {moment(generated)} UTC</p>
{table(["", ""], fact_rows, text_columns=2)}
<h2>Throughput, failures, latency</h2>
{images}
<h2>Endpoints and message types</h2>
<p class="muted">processed: audit copies (processing ended in the window); failed: messages
that reached the error queue; failure rate = failed / (processed + failed); msg/s between the
first and last processing end; proc = processing time, crit = critical time (sent to
processed), wait = queue wait (critical minus processing time); percentiles from merged KLL
sketches.</p>
{summary_table(summary)}
<h2>Top exceptions per endpoint</h2>
{table(["endpoint", "exception", "message (first line)", "count", "first seen", "last seen",
        "message types"], exception_rows, text_columns=3, text_last=True)}
<h2>Conversation flow (edges)</h2>
<p class="muted">sending endpoint &rarr; processing endpoint by message type; latency is the
critical time.</p>
{table(["sender", "receiver", "message type", "messages", "p50", "p95", "p99"], edge_rows,
       text_columns=3)}
<h2>Slowest conversations</h2>
<p class="muted">first send to last processing end.</p>
{table(["conversation", "initiated by", "from", "started", "duration", "messages",
        "retries", "failed", "endpoints"], conversation_rows, text_columns=3, text_last=True)}
</body></html>
"""
