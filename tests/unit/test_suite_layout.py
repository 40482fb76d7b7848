"""The suite's units of work for its parallel workers (``tests/conftest.py``)."""

from __future__ import annotations

import collections

import pytest

from tests.conftest import ONE_UNIT, TESTS, UnitScheduling, unit_of_work


def test_the_chaos_run_is_the_unit_with_the_most_tests(request: pytest.FixtureRequest) -> None:
    """Units go out by their number of tests, most first (pytest-xdist's default): the
    chaos run must stay the largest unit to go first, beside the light modules (BUSY in
    tests/conftest.py). Read from this session's collection; a run that did not collect the
    whole suite cannot say."""
    units = collections.Counter(unit_of_work(item.nodeid) for item in request.session.items)
    if "chaos" not in units:
        pytest.skip("the chaos run's tests were not collected")
    largest, _ = units.most_common(1)[0]
    assert largest == "chaos", units.most_common(3)


@pytest.mark.parametrize("folder", ONE_UNIT)
def test_a_one_unit_folder_is_one_unit_of_work(folder: str) -> None:
    modules = sorted((TESTS / folder).glob("test_*.py"))
    assert len(modules) > 1
    units = {unit_of_work(f"tests/{folder}/{module.name}::test_x[a::b]") for module in modules}
    assert units == {folder}


def test_other_tests_are_grouped_by_module() -> None:
    assert unit_of_work("tests/e2e/test_failures.py::test_a") == "e2e/test_failures.py"
    assert unit_of_work("tests/e2e/test_failures.py::test_b[x-y]") == "e2e/test_failures.py"
    assert unit_of_work("tests/integration/test_cli.py::test_a") == "integration/test_cli.py"


def test_the_scheduler_splits_node_ids_into_these_units() -> None:
    scheduler = object.__new__(UnitScheduling)  # its scopes need no workers
    assert scheduler._split_scope("tests/analytics/test_live.py::test_x") == "analytics"
    assert scheduler._split_scope("tests/e2e/test_poison.py::test_x") == "e2e/test_poison.py"


class Worker:
    """What the scheduler sends a worker: the indexes of the tests to run."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)


COLLECTION = ["tests/analytics/test_live.py::test_a", "tests/e2e/test_poison.py::test_b",
              "tests/chaos/test_chaos_run.py::test_c"]


def scheduler_with(running: dict[str, bool], queued: list[str]) -> tuple[UnitScheduling, Worker]:
    """A scheduler whose other worker runs ``running`` (test id -> finished) and whose queue
    holds ``queued`` (test ids, one unit each), and the worker it assigns to next."""
    scheduler = object.__new__(UnitScheduling)
    other, worker = Worker(), Worker()
    scheduler.assigned_work = {other: {unit_of_work(next(iter(running))): dict(running)}}
    scheduler.workqueue = collections.OrderedDict(
        (unit_of_work(nodeid), {nodeid: False}) for nodeid in queued)
    scheduler.registered_collections = {worker: COLLECTION, other: COLLECTION}
    return scheduler, worker


def test_a_busy_unit_waits_while_another_runs_and_a_lighter_one_goes_instead() -> None:
    scheduler, worker = scheduler_with({COLLECTION[2]: False}, [COLLECTION[0], COLLECTION[1]])
    scheduler._assign_work_unit(worker)
    assert worker.sent == [[1]]  # the e2e test, not analytics beside the chaos run
    assert list(scheduler.workqueue) == ["analytics"]


def test_a_busy_unit_goes_once_the_other_is_finished() -> None:
    scheduler, worker = scheduler_with({COLLECTION[2]: True}, [COLLECTION[0], COLLECTION[1]])
    scheduler._assign_work_unit(worker)
    assert worker.sent == [[0]]


def test_with_nothing_lighter_left_a_busy_unit_goes_anyway() -> None:
    scheduler, worker = scheduler_with({COLLECTION[2]: False}, [COLLECTION[0]])
    scheduler._assign_work_unit(worker)
    assert worker.sent == [[0]]
