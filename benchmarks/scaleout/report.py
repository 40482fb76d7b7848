"""The scale-out benchmark's Markdown tables, generated into docs/performance.md.

Everything between the markers :data:`TABLE_START` and :data:`TABLE_END` is replaced by
:func:`write_table`; the prose around them is written by hand. A phase that did not run has
no table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchmarks.scaleout.harness import THRESHOLDS, target_met

TABLE_START = "<!-- scaleout-table:start -->"
TABLE_END = "<!-- scaleout-table:end -->"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "performance.md"


def number(value: float | None, digits: int = 0) -> str:
    """``value`` with thousands separators, ``-`` for None."""
    return "-" if value is None else f"{value:,.{digits}f}"


def drains_table(result: dict[str, Any]) -> list[str]:
    """One row per side of the main drain phase: median rate, spread, ratio to pgbench."""
    sides: dict[str, dict[str, Any]] = result["phases"]["drains"]["sides"]
    limit = sides.get("pgbench", {}).get("msgs_per_s")
    lines = ["| side | msg/s (median) | min - max | vs pgbench |", "|---|---:|---:|---:|"]
    for name, side in sorted(sides.items(), key=lambda item: -item[1]["msgs_per_s"]):
        ratio = f"{side['msgs_per_s'] / limit:.2f}" if limit else "-"
        spread = side["spread"]
        lines.append(f"| {name} | {side['msgs_per_s']:,.0f} | "
                     f"{spread['min']:,.0f} - {spread['max']:,.0f} | {ratio} |")
    return lines


def targets_table(targets: dict[str, float | None]) -> list[str]:
    """The issue's targets: measured, wanted, met."""
    lines = ["| target (ratios: paired medians) | measured | wanted | met |",
             "|---|---:|---:|---|"]
    for key, value in targets.items():
        sign, bound = THRESHOLDS[key]
        met = target_met(key, value)
        lines.append(f"| {key} | {'-' if value is None else value} | {sign} {bound} | "
                     f"{'-' if met is None else 'yes' if met else 'no'} |")
    return lines


def sweep_table(sweep: dict[str, Any], label: str) -> list[str]:
    """A sweep as one row per side, one column per point (msg/s, medians)."""
    points = sorted({p for row in sweep["by_side"].values() for p in row}, key=float)
    lines = [f"| side | {' | '.join(f'{label} {p}' for p in points)} |",
             f"|---|{'---:|' * len(points)}"]
    for side, row in sweep["by_side"].items():
        lines.append(f"| {side} | {' | '.join(number(row.get(p)) for p in points)} |")
    return lines


def latency_table(latency: dict[str, Any]) -> list[str]:
    """The peaks the loads are shares of; each latency run: its rate, sent and handled, and
    the percentiles (ms)."""
    peaks = "; ".join(f"{name} {peak['msgs_per_s']:,.0f}/s ({peak['kind']})"
                      for name, peak in latency["peaks"].items())
    lines = [f"Peaks: {peaks}.", "",
             "| side @ share of its peak | rate/s | sent | handled | to handler start "
             "p50 / p95 / p99 ms | to completion p99 ms | sender lag avg / max ms |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, run in latency["runs"].items():
        start = run["to_handler_start_ms"]
        lag = run["config"]
        lines.append(
            f"| {key} | {run['rate_per_s']:,.0f} | {run['sent']:,} | {run['handled']:,} | "
            f"{number(start.get('p50'), 1)} / {number(start.get('p95'), 1)} / "
            f"{number(start.get('p99'), 1)} | {number(run['to_completion_ms'].get('p99'), 1)} | "
            f"{number(lag.get('schedule_lag_avg_ms'), 1)} / "
            f"{number(lag.get('schedule_lag_max_ms'), 1)} |")
    return lines


def notify_table(notify: dict[str, Any]) -> list[str]:
    """notify_on_send on and off: send rate, end-to-end rate, handler-start latency."""
    lines = ["| side | sends/s | end to end msg/s | to handler start p50 / p99 ms |",
             "|---|---:|---:|---:|"]
    for name, side in notify["sides"].items():
        figures = side["figures"]
        lines.append(f"| {name} | {figures['send_msgs_per_s']:,.0f} | "
                     f"{side['msgs_per_s']:,.0f} | {figures['to_handler_start_p50_ms']:,.1f} / "
                     f"{figures['to_handler_start_p99_ms']:,.1f} |")
    ratios = ", ".join(f"{senders} senders: sends {ratio['send_off_vs_on']}x, end to end "
                       f"{ratio['end_to_end_off_vs_on']}x"
                       for senders, ratio in notify["off_vs_on"].items())
    return [*lines, "", f"Off against on: {ratios}."]


def endurance_lines(endurance: dict[str, Any]) -> list[str]:
    """The endurance drain in one sentence."""
    first, last = endurance["rss_first_mb"], endurance["rss_last_mb"]
    sizes = "; ".join(f"{first[pid]} -> {last[pid]} MB" for pid in first)
    return [f"Endurance: {endurance['handled']:,} of {endurance['messages']:,} messages handled "
            f"({endurance['duplicates']} duplicates) in {endurance['seconds']:,.0f} s "
            f"({endurance['msgs_per_s']:,.0f} msg/s) by `{endurance['side']}`; receiver RSS "
            f"after warm-up ({endurance['warmup_share']:.0%} processed) to the end: {sizes}: "
            f"growth {endurance['rss_growth_pct']}% (peak {endurance['rss_peak_growth_pct']}%)."]


def nodes_table(nodes: dict[str, Any]) -> list[str]:
    """The nodes sweep: msg/s, receivers and the nodes that held them."""
    lines = ["| Ray nodes | receivers per node | msg/s (median) | receivers | nodes with "
             "receivers |", "|---:|---:|---:|---:|---:|"]
    for name, side in nodes["sides"].items():
        _, count, _, per_node = name.split("_")
        figures = side.get("figures", {})
        lines.append(f"| {count} | {per_node} | {side['msgs_per_s']:,.0f} | "
                     f"{number(figures.get('receivers'))} | "
                     f"{number(figures.get('nodes_with_receivers'))} |")
    errors = nodes.get("errors") or {}
    skipped = nodes.get("skipped") or {}
    notes = [f"Left out: {name}: {why}." for name, why in skipped.items()]
    notes += [f"Failed: {errors}."] if errors else []
    return lines + (["", *notes] if notes else [])


def machine(result: dict[str, Any]) -> str:
    """The machine and how loaded it was, from the result's provenance."""
    box = result.get("machine", {})
    loads = result.get("load_average", {})
    return (f"{box.get('cpus', '?')} cores, {box.get('memory_gb', '?')} GiB; load average "
            f"{loads.get('start', '?')} at the start, {loads.get('end', '?')} at the end")


def tables(result: dict[str, Any]) -> str:
    """Every table of the phases that ran, headed by the run's provenance."""
    load = result["load"]
    lines = [f"Commit `{result['commit'][:12]}`, {result['server']}, "
             f"{'`--quick`' if result['quick'] else 'full run'}: {load['messages']:,} "
             f"messages per drain, concurrency {load['concurrency']}, {load['body_bytes']} B "
             f"bodies, {result['runs']} alternating runs (medians); {machine(result)}.", ""]
    phases = result["phases"]
    if "targets" in result:
        lines += [*targets_table(result["targets"]), ""]
    if "drains" in phases:
        lines += [*drains_table(result), ""]
    for phase, label in (("concurrency", "c"), ("sizes", "B")):
        if phase in phases:
            lines += [f"{phase.capitalize()} sweep (msg/s, medians):", "",
                      *sweep_table(phases[phase], label), ""]
    if "latency" in phases:
        lines += [*latency_table(phases["latency"]), ""]
    if "notify" in phases:
        lines += [*notify_table(phases["notify"]), ""]
    if "endurance" in phases:
        lines += [*endurance_lines(phases["endurance"]), ""]
    if "nodes" in phases:
        lines += [*nodes_table(phases["nodes"]), ""]
    return "\n".join(lines).rstrip("\n")


def write_table(result: dict[str, Any], docs: Path = DOCS) -> None:
    """Replace the generated tables between the markers of docs/performance.md."""
    text = docs.read_text(encoding="utf-8")
    if TABLE_START not in text or TABLE_END not in text:
        raise RuntimeError(f"{docs} has no {TABLE_START} ... {TABLE_END} markers")
    pattern = re.compile(re.escape(TABLE_START) + ".*?" + re.escape(TABLE_END), re.S)
    replacement = f"{TABLE_START}\n{tables(result)}\n{TABLE_END}"
    docs.write_text(pattern.sub(lambda _: replacement, text), encoding="utf-8")
