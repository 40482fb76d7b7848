"""The scale-out benchmark's Markdown table (into docs/performance.md) and its plots."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

TABLE_START = "<!-- scaleout-table:start -->"
TABLE_END = "<!-- scaleout-table:end -->"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "performance.md"


def drains_table(result: dict[str, Any]) -> str:
    """One row per side of the main drain phase: median rate, spread, ratio to pgbench."""
    sides: dict[str, dict[str, Any]] = result["phases"]["drains"]["sides"]
    limit = sides.get("pgbench", {}).get("msgs_per_s")
    lines = [
        f"Commit `{result['commit'][:12]}`, {result['server']}, "
        f"{result['load']['messages']:,} messages, concurrency {result['load']['concurrency']}, "
        f"{result['load']['body_bytes']} B bodies, {result['runs']} alternating runs (medians).",
        "",
        "| side | msg/s (median) | min - max | vs pgbench |",
        "|---|---:|---:|---:|",
    ]
    for name, side in sorted(sides.items(), key=lambda item: -item[1]["msgs_per_s"]):
        ratio = f"{side['msgs_per_s'] / limit:.2f}" if limit else "-"
        spread = side["spread"]
        lines.append(f"| {name} | {side['msgs_per_s']:,.0f} | "
                     f"{spread['min']:,.0f} - {spread['max']:,.0f} | {ratio} |")
    lines += ["", "| target ratio (paired medians) | measured |", "|---|---:|"]
    for key, value in result["targets"].items():
        lines.append(f"| {key} | {'-' if value is None else value} |")
    return "\n".join(lines)


def write_table(result: dict[str, Any], docs: Path = DOCS) -> None:
    """Replace the generated table between the markers of docs/performance.md."""
    text = docs.read_text(encoding="utf-8")
    if TABLE_START not in text or TABLE_END not in text:
        raise RuntimeError(f"{docs} has no {TABLE_START} ... {TABLE_END} markers")
    pattern = re.compile(re.escape(TABLE_START) + ".*?" + re.escape(TABLE_END), re.S)
    replacement = f"{TABLE_START}\n{drains_table(result)}\n{TABLE_END}"
    docs.write_text(pattern.sub(lambda _: replacement, text), encoding="utf-8")


def plot(result: dict[str, Any], directory: Path) -> list[Path]:
    """A bar chart of the drain phase and a line per side of each sweep, as PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sides = result["phases"]["drains"]["sides"]
    names = sorted(sides, key=lambda name: sides[name]["msgs_per_s"])
    figure, axes = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5))
    axes.barh(names, [sides[name]["msgs_per_s"] for name in names])
    axes.set_xlabel("messages per second (median)")
    axes.set_title(f"Drain of {result['load']['messages']:,} messages, "
                   f"concurrency {result['load']['concurrency']}")
    figure.tight_layout()
    written.append(directory / "scaleout_drains.png")
    figure.savefig(written[-1], dpi=110)
    plt.close(figure)
    for phase in ("concurrency", "sizes"):
        sweep = result["phases"].get(phase)
        if not sweep:
            continue
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for side, points in sweep["by_side"].items():
            xs = sorted(points, key=float)
            axes.plot([float(x) for x in xs], [points[x] for x in xs], marker="o", label=side)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("concurrency" if phase == "concurrency" else "body bytes")
        axes.set_ylabel("messages per second (median)")
        axes.legend(fontsize=8)
        figure.tight_layout()
        written.append(directory / f"scaleout_{phase}.png")
        figure.savefig(written[-1], dpi=110)
        plt.close(figure)
    return written
