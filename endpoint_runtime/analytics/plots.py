"""The report's PNG plots (matplotlib, no display needed), drawn for an operator's glance:

- ``throughput.png``: messages per second, one panel per endpoint (small multiples);
- ``latency.png``: processing and critical time p50/p95/p99 over time, per endpoint;
- ``queue_wait.png``: queue wait (critical minus processing time) p50/p95/p99 over time;
- ``failures.png``: failed messages per bucket (counts), with the failure rate drawn only
  where the bucket saw at least :data:`MIN_VOLUME` messages (low-volume rates are noise);
- ``retries.png``: retries per bucket;
- ``flow.png``: the conversation flow graph.

Each endpoint has one colour in every plot (:func:`colours`). Names from the data are shown
as plain text (never parsed as math: ``$`` is a dollar), without control characters and cut
to :data:`NAME_CHARS`. Durations are in human units (ms, s, min, h), rates with sensible
precision. With no data a plot says so in the picture instead of failing.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from endpoint_runtime.analytics.timeline import Point
from endpoint_runtime.analytics.units import count, duration, rate

DPI = 90
WIDTH = 10.0
PANEL_HEIGHT = 1.55
MAX_EDGES = 16
MAX_ENDPOINTS = 8
NAME_CHARS = 48
MIN_VOLUME = 50
"""Messages (processed + failed) a bucket needs for its failure rate to be drawn."""
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
Row = Mapping[str, Any]
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def label(name: object) -> str:
    """A name from the data as plot text: control characters shown as ``?``, cut to
    :data:`NAME_CHARS`, and never starting with ``_`` (matplotlib hides such labels)."""
    text = _CONTROL.sub("?", str(name))
    if len(text) > NAME_CHARS:
        text = text[:NAME_CHARS - 1] + "\u2026"
    return "\u200b" + text if text.startswith("_") else text


def colours(names: Sequence[str]) -> dict[str, str]:
    """One colour per endpoint, the same in every plot of a report (by sorted name)."""
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(sorted(names))}


def _plain_text() -> Any:
    """Text drawn as given: ``$`` is a dollar, never the start of math."""
    return matplotlib.rc_context({"text.parse_math": False, "text.usetex": False})


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _plain_text():
        figure.savefig(path)
    plt.close(figure)
    return path


def _empty(axes: Axes, text: str = "no data in this window") -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", fontsize=14, color="0.4",
              transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def _time_axis(axes: Axes, times: Sequence[datetime], seconds: int) -> None:
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    if times:
        # A bucket either side: a single bucket gets an axis of three, not of years.
        step = timedelta(seconds=seconds)
        axes.set_xlim(mdates.date2num(min(times) - step),  # type: ignore[no-untyped-call]
                      mdates.date2num(max(times) + step))  # type: ignore[no-untyped-call]


def _busiest(timeline: Mapping[str, Sequence[Point]]) -> list[str]:
    totals = {name: sum(p.processed + p.failed for p in points)
              for name, points in timeline.items()}
    return sorted(totals, key=lambda name: (-totals[name], name))[:MAX_ENDPOINTS]


def _panels(title: str, count_: int, columns: int = 1) -> tuple[Figure, list[list[Axes]]]:
    with _plain_text():
        figure, grid = plt.subplots(
            max(1, count_), columns, figsize=(WIDTH, 0.9 + PANEL_HEIGHT * max(1, count_)),
            dpi=DPI, layout="constrained", sharex=True, squeeze=False)
        figure.suptitle(title, fontsize=12, x=0.01, ha="left")
    return figure, [list(row) for row in grid]


def _panel_title(axes: Axes, name: str, colour: str, note: str = "") -> None:
    axes.set_title(label(name) + (f"  \u00b7  {note}" if note else ""), fontsize=9.5,
                   loc="left", color=colour, fontweight="bold", pad=2)
    axes.grid(True, alpha=0.3)


def _times(points: Sequence[Point]) -> list[float]:
    return list(mdates.date2num([p.bucket for p in points]))  # type: ignore[no-untyped-call]


Panel = Callable[[list[Axes], str, Sequence[Point], str], None]
"""Draws one endpoint's row of panels: (axes, endpoint, its points, its colour)."""


def _small_multiples(timeline: Mapping[str, Sequence[Point]], path: Path, seconds: int,
                     title: str, draw: Panel, columns: int = 1) -> Path:
    """A row of panels per endpoint (the busiest :data:`MAX_ENDPOINTS`), sharing the time
    axis, each in the endpoint's colour."""
    names = _busiest(timeline)
    palette = colours(list(timeline))
    figure, grid = _panels(title, len(names), columns)
    if not names:
        _empty(grid[0][0])
        return _save(figure, path)
    for row, name in zip(grid, names, strict=False):
        draw(row, name, timeline[name], palette[name])
        for axes in row:
            _time_axis(axes, [p.bucket for p in timeline[name]], seconds)
    return _save(figure, path)


def throughput(timeline: Mapping[str, Sequence[Point]], path: Path, seconds: int) -> Path:
    """Messages per second per endpoint, a panel each (its own scale)."""
    def draw(row: list[Axes], name: str, points: Sequence[Point], colour: str) -> None:
        axes = row[0]
        values = [p.per_second for p in points]
        axes.fill_between(_times(points), values, color=colour, alpha=0.25, linewidth=0)
        axes.plot(_times(points), values, color=colour, linewidth=1.2,
                  marker="o" if len(points) < 30 else None, markersize=3)
        axes.set_ylim(bottom=0, top=max(max(values, default=0) * 1.15, 1e-9))
        axes.yaxis.set_major_formatter(_rate_axis(max(values, default=0.0)))
        total = sum(p.processed for p in points)
        _panel_title(axes, name, colour,
                     f"{count(total)} processed, peak {rate(max(values, default=0.0))}")

    return _small_multiples(timeline, path, seconds, f"Throughput per endpoint (processed "
                            f"messages, {_bucket(seconds)} buckets, UTC)", draw)


def durations(timeline: Mapping[str, Sequence[Point]], path: Path, seconds: int,
              measures: Sequence[tuple[str, str]], title: str) -> Path:
    """p50/p95/p99 of each of ``measures`` ((name, heading) pairs) over time: a row of
    panels per endpoint, a column per measure, log scale in human units."""
    styles = (("p50", 0.45, 1.0), ("p95", 0.75, 1.4), ("p99", 1.0, 1.0))

    legend: list[bool] = []  # drawn once, above the first panel: never over a line

    def draw(row: list[Axes], name: str, points: Sequence[Point], colour: str) -> None:
        for axes, (measure, heading) in zip(row, measures, strict=True):
            drawn = False
            for index, (quantile, alpha, width) in enumerate(styles):
                values = [p.duration(measure)[index] for p in points]
                values = [v if v > 0 else math.nan for v in values]
                if all(math.isnan(v) for v in values):
                    continue
                drawn = True
                axes.plot(_times(points), values, color=colour, alpha=alpha,
                          linewidth=width, linestyle=":" if quantile == "p99" else "-",
                          marker="o" if len(points) < 30 else None, markersize=3,
                          label=quantile)
            if drawn:
                axes.set_yscale("log")
                axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: duration(v)))
                axes.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
                if not legend:
                    legend.append(True)
                    axes.legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0),
                                ncols=3, frameon=False, borderaxespad=0.1)
            else:
                _empty(axes, "nothing processed")
            _panel_title(axes, name, colour, heading)

    return _small_multiples(timeline, path, seconds, title, draw, columns=len(measures))


def _rate_axis(highest: float) -> FuncFormatter:
    """Tick labels in one unit for the whole axis: msg/s, msg/min or msg/h by its top."""
    scale, unit = (1, "msg/s") if highest >= 1 else (60, "msg/min") if highest * 60 >= 1 \
        else (3600, "msg/h")
    return FuncFormatter(lambda v, _: f"{v * scale:.3g} {unit}" if v else "0")


def _bars(axes: Axes, points: Sequence[Point], values: Sequence[int], seconds: int,
          colour: str) -> None:
    """Counts per bucket as bars a bucket wide, from zero, in whole-number units."""
    axes.bar(_times(points), values, width=seconds / 86400 * 0.9, align="edge", color=colour)
    axes.set_ylim(bottom=0, top=max(max(values, default=0) * 1.2, 1))
    axes.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: count(v)))


def failures(timeline: Mapping[str, Sequence[Point]], path: Path, seconds: int) -> Path:
    """Failed messages per bucket (bars), and the failure rate (red dots, right axis) only
    where the bucket saw at least :data:`MIN_VOLUME` messages."""
    def draw(row: list[Axes], name: str, points: Sequence[Point], colour: str) -> None:
        axes = row[0]
        failed = [p.failed for p in points]
        _bars(axes, points, failed, seconds, colour)
        meaningful = [(t, p.failure_rate * 100) for t, p in zip(_times(points), points,
                                                                 strict=True)
                      if p.processed + p.failed >= MIN_VOLUME and p.failed]
        if meaningful:
            highest = max(r for _, r in meaningful)
            right = axes.twinx()
            right.scatter([t for t, _ in meaningful], [r for _, r in meaningful], s=9,
                          color="#c0392b", zorder=3)
            right.set_ylim(0, 100.0 if highest > 50 else max(highest * 1.3, 0.1))
            right.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g} %"))
            right.tick_params(labelsize=7, colors="#c0392b")
        total = sum(failed)
        worst = max(points, key=lambda p: p.failed)
        note = f"{count(total)} failed" + (
            f", most at {worst.bucket:%m-%d %H:%M} ({count(worst.failed)})" if total else "")
        _panel_title(axes, name, colour, note)

    return _small_multiples(timeline, path, seconds, f"Failed messages per "
                            f"{_bucket(seconds)} (bars); failure rate where at least "
                            f"{MIN_VOLUME} messages (dots, right axis)", draw)


def retries(timeline: Mapping[str, Sequence[Point]], path: Path, seconds: int) -> Path:
    """Delayed retries per bucket (of messages processed in it), per endpoint."""
    def draw(row: list[Axes], name: str, points: Sequence[Point], colour: str) -> None:
        values = [p.retries for p in points]
        _bars(row[0], points, values, seconds, colour)
        _panel_title(row[0], name, colour, f"{count(sum(values))} retries")

    return _small_multiples(timeline, path, seconds,
                            f"Retries before success per {_bucket(seconds)}", draw)


def _bucket(seconds: int) -> str:
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def draw_all(timeline: Mapping[str, Sequence[Point]], edges: Sequence[Row], seconds: int,
             directory: Path) -> dict[str, Path]:
    """Every plot of the page, caption to file."""
    palette = colours(list(timeline))
    with _plain_text():
        return {
            "Throughput per endpoint": throughput(timeline, directory / "throughput.png",
                                                  seconds),
            "Latency percentiles over time": durations(
                timeline, directory / "latency.png", seconds,
                (("processing_ms", "processing time"), ("critical_ms", "critical time")),
                f"Processing and critical time p50 / p95 / p99 ({_bucket(seconds)} buckets, "
                f"log scale)"),
            "Queue wait over time": durations(
                timeline, directory / "queue_wait.png", seconds,
                (("wait_ms", "queue wait = critical - processing time"),),
                f"Queue wait p50 / p95 / p99 ({_bucket(seconds)} buckets, log scale)"),
            "Failures per endpoint": failures(timeline, directory / "failures.png", seconds),
            "Retries per endpoint": retries(timeline, directory / "retries.png", seconds),
            "Conversation flow": flow_graph(edges, directory / "flow.png", palette),
        }


def layers(pairs: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Column of each endpoint, left to right: endpoints nothing sends to first, then each
    one a step right of the first endpoint found sending to it (breadth first)."""
    nodes = sorted({name for pair in pairs for name in pair})
    targets: dict[str, list[str]] = defaultdict(list)
    incoming: set[str] = set()
    for sender, receiver in pairs:
        if sender != receiver:
            targets[sender].append(receiver)
            incoming.add(receiver)
    sources = [name for name in nodes if name not in incoming] or nodes[:1]
    layer = dict.fromkeys(sources, 0)
    queue = list(sources)
    while queue:
        name = queue.pop(0)
        for target in sorted(targets[name]):
            if target not in layer:
                layer[target] = layer[name] + 1
                queue.append(target)
    return {name: layer.get(name, 0) for name in nodes}


def flow_graph(edges: Sequence[Row], path: Path,
               palette: Mapping[str, str] | None = None) -> Path:
    """Endpoints in columns (senders left), an arrow per (sender, receiver) labelled with its
    message types and counts; the :data:`MAX_EDGES` busiest pairs."""
    figure, axes = plt.subplots(figsize=(11.0, 5.4), dpi=DPI, layout="constrained")
    axes.set_title("Conversation flow: sending endpoint \u2192 processing endpoint "
                   "(messages per type)", fontsize=13, loc="left")
    pairs: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for edge in edges:
        pairs[(label(edge["sender"]), label(edge["receiver"]))].append(
            (int(edge["messages"]), label(edge["message_type"])))
    if not pairs:
        _empty(axes)
        return _save(figure, path)
    busiest = sorted(pairs.items(), key=lambda item: -sum(n for n, _ in item[1]))[:MAX_EDGES]
    column = layers([pair for pair, _ in busiest])
    width_units = max(1, max(column.values()))
    by_column: dict[int, list[str]] = defaultdict(list)
    for name in sorted(column):
        by_column[column[name]].append(name)
    position: dict[str, tuple[float, float]] = {}
    for index, names in by_column.items():
        for row, name in enumerate(names):
            y = 0.0 if len(names) == 1 else 1.0 - 2.0 * row / (len(names) - 1)
            position[name] = (index * 13.0 / width_units, y * 2.2)
    heaviest = max(sum(n for n, _ in kinds) for _, kinds in busiest)
    for (sender, receiver), kinds in busiest:
        total = sum(n for n, _ in kinds)
        kinds.sort(reverse=True)
        text = "\n".join(f"{kind} \u00d7{count:,}" for count, kind in kinds[:3])
        if len(kinds) == 1:  # narrower: the count under the type
            text = f"{kinds[0][1]}\n\u00d7{kinds[0][0]:,}"
        if len(kinds) > 3:
            text += f"\n+{len(kinds) - 3} more types"
        width = 1.0 + 4.0 * math.log1p(total) / math.log1p(heaviest)
        (x1, y1), (x2, y2) = position[sender], position[receiver]
        box = {"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85}
        if sender == receiver:
            axes.text(x1 + 0.2, y1 - 0.45, f"\u21bb {text}", fontsize=8.5, ha="left",
                      va="top", color="0.15", bbox=box)
            continue
        backwards = column[receiver] <= column[sender]
        rad = -0.35 if backwards else 0.1
        arrow = FancyArrowPatch((x1, y1), (x2, y2), arrowstyle="-|>", mutation_scale=18,
                                connectionstyle=f"arc3,rad={rad}", linewidth=width,
                                color="#c0504d" if backwards else "#4a6fa5", alpha=0.7,
                                shrinkA=30, shrinkB=30)
        axes.add_patch(arrow)
        # The middle of the arc (arc3's control point lies rad x the chord off its middle).
        mx = (x1 + x2) / 2 + 0.5 * rad * (y2 - y1)
        my = (y1 + y2) / 2 - 0.5 * rad * (x2 - x1)
        level = abs(y2 - y1) < 0.1  # a level arrow: its label above it, not on it
        axes.text(mx, my + (0.2 if level else 0.0), text, fontsize=8.5, ha="center",
                  va="bottom" if level else "center", color="0.15", bbox=box)
    colour_of = {label(name): colour for name, colour in (palette or {}).items()}
    for name, (x, y) in position.items():
        axes.text(x, y, name, ha="center", va="center", fontsize=11, fontweight="bold",
                  bbox={"boxstyle": "round,pad=0.5", "fc": "#f4f6f9",
                        "ec": colour_of.get(name, "#4a6fa5"), "linewidth": 2.2})
    axes.set_xlim(-1.2, 14.2)
    axes.set_ylim(-3.0, 3.0)
    axes.set_aspect("equal")
    axes.set_axis_off()
    return _save(figure, path)
