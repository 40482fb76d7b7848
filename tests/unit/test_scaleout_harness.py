"""The scale-out benchmark's reductions: medians per side, ratios paired within a run, the
generated docs table (pure logic, no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scaleout import report
from benchmarks.scaleout.harness import paired_ratio, per_side, target_ratios
from benchmarks.scaleout.side import DrainResult, Load

LOAD = Load(messages=1000, concurrency=4)


def drains(name: str, *seconds: float) -> list[DrainResult]:
    return [DrainResult(name, {"n": 1}, LOAD, s, LOAD.messages, 0) for s in seconds]


def test_a_ratio_pairs_the_runs_it_compares() -> None:
    # Run 1: 1000/s vs 500/s (2.0); run 2: 250/s vs 500/s (0.5); run 3: 500/s vs 250/s (2.0).
    results = {"a": drains("a", 1.0, 4.0, 2.0), "b": drains("b", 2.0, 2.0, 4.0)}
    assert paired_ratio(results, "a", "b") == 2.0
    assert paired_ratio(results, "a", "missing") is None


def test_per_side_reports_the_median_and_the_spread() -> None:
    side = per_side({"a": drains("a", 1.0, 2.0, 4.0)})["a"]
    assert side["msgs_per_s"] == 500.0
    assert (side["spread"]["min"], side["spread"]["max"]) == (250.0, 1000.0)
    assert side["runs"] == 3


def test_targets_name_every_ratio_of_the_issue() -> None:
    assert set(target_ratios({})) == {
        "batched_vs_pgqueuer_best", "single_vs_pgqueuer_best", "single_vs_procrastinate_default",
        "single_vs_lean_asyncpg", "batched_vs_lean_asyncpg_batched", "single_vs_pgbench",
        "batched_vs_lean_asyncpg_optimistic", "batched_failing_1pct_vs_batched",
        "lean_failing_1pct_vs_lean_optimistic", "batched_savepoint_vs_lean_asyncpg_batched"}


def test_the_table_replaces_only_what_lies_between_its_markers(tmp_path: Path) -> None:
    docs = tmp_path / "performance.md"
    docs.write_text(f"before\n{report.TABLE_START}\nold\n{report.TABLE_END}\nafter\n")
    result = {"commit": "abc", "server": "s", "runs": 1, "load": vars(LOAD), "quick": True,
              "phases": {"drains": {"sides": per_side({"pgbench": drains("pgbench", 1.0),
                                                       "x": drains("x", 2.0)})}},
              "targets": {"single_vs_pgbench": 0.5}}
    report.write_table(result, docs)
    text = docs.read_text()
    assert text.startswith("before\n")
    assert text.endswith("after\n")
    assert "old" not in text
    assert "| x | 500 | 500 - 500 | 0.50 |" in text


def test_the_table_needs_its_markers(tmp_path: Path) -> None:
    docs = tmp_path / "performance.md"
    docs.write_text("no markers\n")
    with pytest.raises(RuntimeError, match="markers"):
        report.write_table({}, docs)
