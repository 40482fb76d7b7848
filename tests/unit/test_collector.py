"""The receiver process's garbage collector settings (pure: this process's collector, put back
after each test)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from endpoint_runtime.runtime.collector import YOUNG_THRESHOLD, tune_receiver_process


@pytest.fixture(autouse=True)
def collector_put_back() -> Iterator[None]:
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    if enabled:
        gc.enable()


def test_the_young_threshold_is_raised_and_what_exists_is_frozen() -> None:
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    assert tune_receiver_process() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0  # the modules, this test's frames...


def test_a_higher_threshold_of_the_users_own_is_kept() -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 5, 20, 30)
    assert tune_receiver_process() == (YOUNG_THRESHOLD * 5, 20, 30)


def test_a_collector_switched_off_by_threshold_zero_stays_off() -> None:
    gc.set_threshold(0, 10, 10)
    assert tune_receiver_process()[0] == 0
