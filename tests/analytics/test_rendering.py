"""Without Spark: hostile names (HTML, ``$``, control characters, 10 kB) render escaped in
the page and as plain text in every plot, never crashing; figures print in human units."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from endpoint_runtime.analytics import plots
from endpoint_runtime.analytics.page import esc, render
from endpoint_runtime.analytics.timeline import Point
from endpoint_runtime.analytics.units import duration, rate

START = datetime(2026, 3, 2, tzinfo=UTC)
HOSTILE = ("Acme.Order$Line_$1", "price$calc$", "<script>alert(1)</script>",
           "_hidden\x1b[31mred\x00", "x" * 10_000)


def timeline(names: tuple[str, ...], buckets: int) -> dict[str, list[Point]]:
    return {name: [Point(bucket=START + timedelta(minutes=5 * i), per_second=1.5,
                         processed=450, failed=i % 3, retries=i % 2,
                         durations=((3.0, 40.0, 900.0), (20.0, 7_152_776.9, 8e6),
                                    (10.0, 30.0, 50.0)))
                   for i in range(buckets)] for name in names}


def summary_row(name: str) -> dict[str, object]:
    row: dict[str, object] = {"endpoint": name, "message_type": None, "processed": 10,
                              "failed": 1, "failure_rate": 0.1, "per_second": 0.004,
                              "retries": 0}
    for prefix in ("processing_ms", "critical_ms", "wait_ms"):
        for label in ("p50", "p95", "p99"):
            row[f"{prefix}_{label}"] = 7_152_776.9
    return row


@pytest.mark.parametrize("buckets", [1, 40])
def test_hostile_names_draw_as_plain_text(tmp_path: Path, buckets: int) -> None:
    edges = [{"sender": a, "receiver": b, "message_type": a, "messages": 3}
             for a, b in itertools.pairwise(HOSTILE)]
    drawn = plots.draw_all(timeline(HOSTILE, buckets), edges, 300, tmp_path)
    assert len(drawn) == 6
    for path in drawn.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plots.label("Acme.Order$Line_$1") == "Acme.Order$Line_$1"
    assert plots.label("_hidden\x1b[31m").startswith("\u200b_hidden?")
    assert len(plots.label("x" * 10_000)) == plots.NAME_CHARS


def test_one_colour_per_endpoint_in_every_plot() -> None:
    first = plots.colours(["sales", "billing", "web"])
    again = plots.colours(["web", "sales", "billing"])
    assert first == again
    assert len(set(first.values())) == 3


def test_hostile_names_are_escaped_in_the_page() -> None:
    page = render(title="t", window="w", generated=START, facts=[("a", HOSTILE[3])],
                  summary=[summary_row(n) for n in HOSTILE],
                  exceptions=[{"endpoint": n, "exception_type": n, "exception_message": n,
                               "count": 1, "first_seen": START, "last_seen": START,
                               "message_types": [n]} for n in HOSTILE],
                  edges=[], slowest=[], plots={})
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x1b" not in page
    assert "\x00" not in page
    assert esc("a\x1bb") == "a\\x1bb"
    assert "Acme.Order$Line_$1" in page
    assert "7,152,776.9" not in page
    assert "1.99 h" in page


def test_human_units() -> None:
    assert [duration(v) for v in (0.25, 850.0, 1234.0, 210_000.0, 7_152_776.9)] == [
        "0.25 ms", "850 ms", "1.23 s", "3.5 min", "1.99 h"]
    assert duration(math.nan) == "-"
    assert [rate(v) for v in (1234.5, 2.5, 0.25, 0.001)] == [
        "1,234 msg/s", "2.5 msg/s", "15 msg/min", "3.6 msg/h"]
