"""The suite's units of work for its parallel workers (``tests/conftest.py``)."""

from __future__ import annotations

import pytest

from tests.conftest import FIRST, ONE_UNIT, TESTS, UnitScheduling, unit_of_work


def test_each_first_unit_names_a_path_that_exists() -> None:
    """A renamed module would silently lose its early place: every entry must exist."""
    missing = [prefix for prefix in FIRST if not (TESTS / prefix).exists()]
    assert missing == []


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
