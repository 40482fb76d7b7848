"""The report's PNG plots (matplotlib, no display needed): throughput over time per
endpoint, failure rate over time per endpoint, latency percentiles per endpoint, the flow
graph. Each takes plain Python rows and writes one file; with no data it says so in the
picture instead of failing."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

SIZE = (10.0, 4.8)
DPI = 100
MAX_EDGES = 16
MAX_ENDPOINTS = 10
Row = Mapping[str, Any]
Series = Mapping[str, Sequence[tuple[datetime, float]]]


def _figure(title: str) -> tuple[Figure, Axes]:
    figure, axes = plt.subplots(figsize=SIZE, dpi=DPI, layout="constrained")
    axes.set_title(title, fontsize=13, loc="left")
    axes.grid(True, alpha=0.3)
    return figure, axes


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def _empty(axes: Axes, text: str = "no data in this window") -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", fontsize=14, color="0.4",
              transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def _time_axis(axes: Axes) -> None:
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    axes.set_xlabel("time (UTC)")


def _busiest(series: Series) -> list[str]:
    totals = {name: sum(value for _, value in points if not math.isnan(value))
              for name, points in series.items()}
    return sorted(totals, key=lambda name: -totals[name])[:MAX_ENDPOINTS]


def time_series(series: Series, path: Path, title: str, ylabel: str,
                percent: bool = False) -> Path:
    """One line per endpoint (the busiest :data:`MAX_ENDPOINTS`)."""
    figure, axes = _figure(title)
    if not any(series.values()):
        _empty(axes)
        return _save(figure, path)
    for name in _busiest(series):
        points = series[name]
        times = mdates.date2num(  # type: ignore[no-untyped-call]
            [moment for moment, _ in points])
        values = [value * 100 if percent else value for _, value in points]
        axes.plot(times, values, label=name, linewidth=1.6,
                  marker="o" if len(points) < 30 else None, markersize=3)
    _time_axis(axes)
    axes.set_ylabel(ylabel)
    axes.set_ylim(bottom=0)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False,
                title="endpoint")  # beside the plot: never over a line
    return _save(figure, path)


def latency(summary: Sequence[Row], path: Path) -> Path:
    """Processing and critical time p50/p95/p99 per endpoint, bars on a log scale."""
    rows = [row for row in summary if row["message_type"] is None and row["processed"]]
    figure, axes = _figure("Latency percentiles per endpoint (ms, log scale)")
    if not rows:
        _empty(axes)
        return _save(figure, path)
    rows = sorted(rows, key=lambda row: -int(row["processed"]))[:MAX_ENDPOINTS]
    bars = [("processing", "processing_ms", ("#9ecae1", "#4292c6", "#08519c")),
            ("critical", "critical_ms", ("#fdae6b", "#f16913", "#a63603"))]
    width = 0.8 / 6
    for group, (kind, prefix, colours) in enumerate(bars):
        for index, (label, colour) in enumerate(zip(("p50", "p95", "p99"), colours,
                                                     strict=True)):
            offset = (group * 3 + index - 2.5) * width
            values = [max(float(row[f"{prefix}_{label}"] or 0.0), 1e-3) for row in rows]
            axes.bar([i + offset for i in range(len(rows))], values, width,
                     label=f"{kind} {label}", color=colour)
    axes.set_yscale("log")
    axes.set_xticks(range(len(rows)), [str(row["endpoint"]) for row in rows],
                    rotation=20 if len(rows) > 5 else 0, ha="right" if len(rows) > 5 else "center")
    axes.set_ylabel("milliseconds")
    axes.legend(fontsize=9, ncols=6, loc="upper center", bbox_to_anchor=(0.5, -0.1),
                frameon=False)  # below the plot: never over a bar
    return _save(figure, path)


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


def flow_graph(edges: Sequence[Row], path: Path) -> Path:
    """Endpoints in columns (senders left), an arrow per (sender, receiver) labelled with its
    message types and counts; the :data:`MAX_EDGES` busiest pairs."""
    figure, axes = plt.subplots(figsize=(11.0, 5.4), dpi=DPI, layout="constrained")
    axes.set_title("Conversation flow: sending endpoint \u2192 processing endpoint "
                   "(messages per type)", fontsize=13, loc="left")
    pairs: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for edge in edges:
        pairs[(str(edge["sender"]), str(edge["receiver"]))].append(
            (int(edge["messages"]), str(edge["message_type"])))
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
        label = "\n".join(f"{kind} \u00d7{count:,}" for count, kind in kinds[:3])
        if len(kinds) == 1:  # narrower: the count under the type
            label = f"{kinds[0][1]}\n\u00d7{kinds[0][0]:,}"
        if len(kinds) > 3:
            label += f"\n+{len(kinds) - 3} more types"
        width = 1.0 + 4.0 * math.log1p(total) / math.log1p(heaviest)
        (x1, y1), (x2, y2) = position[sender], position[receiver]
        box = {"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85}
        if sender == receiver:
            axes.text(x1 + 0.2, y1 - 0.45, f"\u21bb {label}", fontsize=8.5, ha="left",
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
        axes.text(mx, my + (0.2 if level else 0.0), label, fontsize=8.5, ha="center",
                  va="bottom" if level else "center", color="0.15", bbox=box)
    for name, (x, y) in position.items():
        axes.text(x, y, name, ha="center", va="center", fontsize=11, fontweight="bold",
                  bbox={"boxstyle": "round,pad=0.5", "fc": "#e8eef7", "ec": "#4a6fa5"})
    axes.set_xlim(-1.2, 14.2)
    axes.set_ylim(-3.0, 3.0)
    axes.set_aspect("equal")
    axes.set_axis_off()
    return _save(figure, path)
