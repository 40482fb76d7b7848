"""The scale-out phases' pure logic: RSS growth after warm-up, pgbench's output and script,
the nodes sweep's lines, notify's ratios, the targets' bounds (no database, no Ray)."""

from __future__ import annotations

import re

from benchmarks.scaleout.endurance import rss_growth
from benchmarks.scaleout.harness import median_figures, target_met
from benchmarks.scaleout.nodes import by_nodes, fitting, nodes_side
from benchmarks.scaleout.notify import NotifySide, notify_ratios
from benchmarks.scaleout.pgbench_sender import parse_pgbench, send_script
from benchmarks.scaleout.side import DrainResult, Load


def sample(processed: int, **rss: float) -> dict[str, object]:
    return {"t": 0.0, "processed": processed, "rss_mb": rss}


def test_rss_growth_starts_after_the_warm_up_and_takes_the_worst_receiver() -> None:
    samples = [sample(0, a=50.0), sample(100, a=100.0, b=200.0), sample(500, a=101.0, b=220.0),
               sample(1000, a=102.0, b=210.0)]
    growth = rss_growth(samples, total=1000, warmup_share=0.1)
    assert growth["rss_growth_pct"] == 5.0  # b: 200 -> 210; a's 50 MB before warm-up ignored
    assert growth["rss_peak_growth_pct"] == 10.0  # b at 220
    assert growth["rss_first_mb"] == {"a": 100.0, "b": 200.0}


def test_rss_growth_needs_two_samples_after_the_warm_up() -> None:
    assert rss_growth([sample(1000, a=1.0)], total=1000, warmup_share=0.1)["rss_growth_pct"] is None


PGBENCH_OUTPUT = """transaction type: /tmp/x.sql
number of transactions actually processed: 5928
latency average = 1.4 ms
rate limit schedule lag: avg 0.223 (max 9.276) ms
"""


def test_parse_pgbench_reads_the_count_and_the_schedule_lag() -> None:
    assert parse_pgbench(PGBENCH_OUTPUT) == {
        "sent": 5928.0, "schedule_lag_avg_ms": 0.223, "schedule_lag_max_ms": 9.276}


def test_the_send_script_has_no_pgbench_variables() -> None:
    # pgbench replaces ``:name`` in a script; only the casts' ``::`` may have colons.
    script = send_script('"public"."q"', 100)
    assert not re.search(r"(?<!:):(?!:)", script)
    assert script.count("INSERT INTO") == 1


def test_nodes_sides_and_lines() -> None:
    side = nodes_side(3, 2)
    assert side.name == "nodes_3_receivers_2"
    assert side.overrides == {"max_concurrency": 24, "slots_per_receiver": 4, "min_receivers": 6}
    sides = {"nodes_1_receivers_1": {"msgs_per_s": 10.0},
             "nodes_2_receivers_1": {"msgs_per_s": 12.0},
             "nodes_2_receivers_2": {"msgs_per_s": 9.0}}
    assert by_nodes(sides) == {"1": {"1": 10.0, "2": 12.0}, "2": {"2": 9.0}}


def test_nodes_points_that_cannot_fit_the_servers_connections_are_left_out() -> None:
    # 3 nodes x 4 receivers of 4 slots: 12 x (2 x 4 + 1 + LISTEN) + 5 for the peeker = 125,
    # and the drain's own 4: what a server of max_connections 100 cannot give (the full run's
    # 3-node point failed on it and took the 1- and 2-receiver points with it).
    kept, skipped = fitting(3, (1, 2, 4), available=97)
    assert kept == (1, 2)
    assert list(skipped) == ["nodes_3_receivers_4"]
    assert "129 connections" in skipped["nodes_3_receivers_4"]
    assert fitting(3, (1, 2, 4), available=129) == ((1, 2, 4), {})


def test_notify_ratios_divide_off_by_on() -> None:
    on, off = NotifySide(True, 16).name, NotifySide(False, 16).name
    sides = {on: {"msgs_per_s": 100.0, "figures": {"send_msgs_per_s": 200.0}},
             off: {"msgs_per_s": 50.0, "figures": {"send_msgs_per_s": 800.0}}}
    assert notify_ratios(sides, 16) == {"send_off_vs_on": 4.0, "end_to_end_off_vs_on": 0.5}
    assert notify_ratios({}, 16) == {"send_off_vs_on": None, "end_to_end_off_vs_on": None}


def test_targets_bounds() -> None:
    assert target_met("single_vs_pgbench", 0.75) is True
    assert target_met("latency_p99_ms_at_50pct", 25.0) is False
    assert target_met("rss_growth_pct", 10.0) is True
    assert target_met("rss_growth_pct", None) is None


def test_median_figures_per_key() -> None:
    load = Load(10, 1)
    drains = [DrainResult("a", {}, load, 1.0, 10, 0, {"x": value}) for value in (1.0, 3.0, 2.0)]
    assert median_figures(drains) == {"x": 2.0}
