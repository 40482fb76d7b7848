from __future__ import annotations

import msgspec

from endpoint_runtime.runtime.actors.scaling import ScalingInput, allowances, receivers_needed

BASE = ScalingInput(
    estimate=0, busy_slots=0, current_receivers=1, idle_seconds=0.0, max_concurrency=8,
    slots_per_receiver=2, min_receivers=1, scale_down_after=10.0,
)


def state(**changes: object) -> ScalingInput:
    return msgspec.structs.replace(BASE, **changes)


def test_backlog_scales_up_at_once_within_the_limit() -> None:
    assert receivers_needed(state(estimate=3)) == 2
    assert receivers_needed(state(estimate=1000)) == 4  # 8 slots / 2 per receiver


def test_work_in_flight_counts_as_need() -> None:
    assert receivers_needed(state(estimate=0, busy_slots=4, current_receivers=2)) == 2


def test_scale_down_waits_for_idle_time() -> None:
    assert receivers_needed(state(current_receivers=4, idle_seconds=3.0)) == 4
    assert receivers_needed(state(current_receivers=4, idle_seconds=10.0)) == 1


def test_min_receivers_kept_even_when_idle() -> None:
    assert receivers_needed(state(min_receivers=0, current_receivers=1, idle_seconds=99)) == 0
    assert receivers_needed(state(min_receivers=3, idle_seconds=99)) == 3


def test_allowances_never_sum_above_max_concurrency() -> None:
    assert allowances(3, 5, 2) == [2, 2, 1]
    assert allowances(4, 5, 2) == [2, 2, 1, 0]
    for receivers in range(10):
        for limit in range(1, 12):
            assert sum(allowances(receivers, limit, 3)) <= limit
