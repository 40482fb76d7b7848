"""The scale-out benchmark's PNG plots (matplotlib), one per phase that ran.

- ``scaleout_drains.png``: every side's median drain rate (bars, with the runs' range);
- ``scaleout_concurrency.png``, ``scaleout_sizes.png``: a line per side over the sweep;
- ``scaleout_latency.png``: send-to-handler-start p50/p95/p99 per side and load;
- ``scaleout_notify.png``: send and end-to-end rates with notify_on_send on and off;
- ``scaleout_endurance.png``: each receiver's RSS against messages processed;
- ``scaleout_nodes.png``: msg/s over Ray nodes, a line per receivers-per-node count.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

Figure = Any
Axes = Any


def drains(axes: Axes, result: dict[str, Any]) -> None:
    """Bars of every side's median drain rate, the runs' range as error bars."""
    sides = result["phases"]["drains"]["sides"]
    names = sorted(sides, key=lambda name: sides[name]["msgs_per_s"])
    rates = [sides[name]["msgs_per_s"] for name in names]
    low = [rate - sides[name]["spread"]["min"] for name, rate in zip(names, rates, strict=True)]
    high = [sides[name]["spread"]["max"] - rate for name, rate in zip(names, rates, strict=True)]
    axes.barh(names, rates, xerr=[low, high], capsize=3)
    axes.set_xlabel("messages per second (median; bars: min to max of the runs)")
    axes.set_title(f"Drains of {result['load']['messages']:,} messages, "
                   f"concurrency {result['load']['concurrency']}")


def sweep(phase: str) -> Callable[[Axes, dict[str, Any]], None]:
    """A drawing of one sweep phase: a line per side, log-log."""
    def draw(axes: Axes, result: dict[str, Any]) -> None:
        for side, points in result["phases"][phase]["by_side"].items():
            xs = sorted(points, key=float)
            axes.plot([float(x) for x in xs], [points[x] for x in xs], marker="o", label=side)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("concurrency" if phase == "concurrency" else "body bytes")
        axes.set_ylabel("messages per second (median)")
        axes.set_title(f"{phase.capitalize()} sweep")
        axes.legend(fontsize=8)
    return draw


def latency(axes: Axes, result: dict[str, Any]) -> None:
    """p50, p95 and p99 of send to handler start per latency run (log scale)."""
    runs = result["phases"]["latency"]["runs"]
    keys = list(runs)
    for offset, q in enumerate(("p50", "p95", "p99")):
        values = [max(runs[key]["to_handler_start_ms"].get(q, 0.0), 0.01) for key in keys]
        axes.barh([i + 0.27 * (offset - 1) for i in range(len(keys))], values, height=0.27,
                  label=q)
    axes.set_yticks(range(len(keys)), keys, fontsize=7)
    axes.set_xscale("log")
    axes.set_xlabel("send to handler start, ms (database clock)")
    axes.set_title("Latency under an open-loop load (shares of each side's peak)")
    axes.legend(fontsize=8)


def notify(axes: Axes, result: dict[str, Any]) -> None:
    """Send rate and end-to-end rate per notify side."""
    sides = result["phases"]["notify"]["sides"]
    names = list(sides)
    positions = range(len(names))
    axes.bar([p - 0.2 for p in positions],
             [sides[n]["figures"]["send_msgs_per_s"] for n in names], width=0.4, label="sends/s")
    axes.bar([p + 0.2 for p in positions], [sides[n]["msgs_per_s"] for n in names], width=0.4,
             label="end to end msg/s")
    axes.set_xticks(list(positions), names, fontsize=7, rotation=15)
    axes.set_title("notify_on_send on and off, closed-loop senders")
    axes.legend(fontsize=8)


def endurance(axes: Axes, result: dict[str, Any]) -> None:
    """Each receiver's RSS against the messages processed."""
    samples = result["phases"]["endurance"]["samples"]
    pids = sorted({pid for sample in samples for pid in sample["rss_mb"]})
    for pid in pids:
        points = [(s["processed"], s["rss_mb"][pid]) for s in samples if pid in s["rss_mb"]]
        axes.plot([p for p, _ in points], [mb for _, mb in points], label=f"receiver {pid}")
    axes.set_xlabel("messages processed")
    axes.set_ylabel("resident set size, MB")
    axes.set_ylim(bottom=0)
    axes.set_title(f"Endurance: RSS growth after warm-up "
                   f"{result['phases']['endurance']['rss_growth_pct']}%")
    axes.legend(fontsize=8)


def nodes(axes: Axes, result: dict[str, Any]) -> None:
    """msg/s over the node count, a line per receivers-per-node count."""
    for per_node, points in sorted(result["phases"]["nodes"]["by_nodes"].items()):
        xs = sorted(points, key=int)
        axes.plot([int(x) for x in xs], [points[x] for x in xs], marker="o",
                  label=f"{per_node} receiver(s) per node")
    axes.set_xlabel("Ray nodes (on one 2-core machine)")
    axes.set_ylabel("messages per second (median)")
    axes.set_ylim(bottom=0)
    axes.set_title("Nodes sweep, single-message atomic mode")
    axes.legend(fontsize=8)


DRAWINGS: dict[str, tuple[Callable[[Axes, dict[str, Any]], None], tuple[float, float]]] = {
    "drains": (drains, (8, 6)),
    "concurrency": (sweep("concurrency"), (7, 4.5)),
    "sizes": (sweep("sizes"), (7, 4.5)),
    "latency": (latency, (8, 5)),
    "notify": (notify, (7, 4.5)),
    "endurance": (endurance, (7, 4.5)),
    "nodes": (nodes, (7, 4.5)),
}


def plot(result: dict[str, Any], directory: Path) -> list[Path]:
    """One PNG per phase that ran, into ``directory``; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for phase, (draw, size) in DRAWINGS.items():
        if not result["phases"].get(phase):
            continue
        figure, axes = plt.subplots(figsize=size)
        draw(axes, result)
        figure.tight_layout()
        written.append(directory / f"scaleout_{phase}.png")
        figure.savefig(written[-1], dpi=100)
        plt.close(figure)
    return written
