"""The mutation script's pure parts (``tests/mutations``): planting, pytest's summary, verdicts.

No database, no pytest run: the mutation runs themselves are not part of the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mutations import runner
from tests.mutations.__main__ import main
from tests.mutations.core import (
    Defect,
    DefectNotApplicable,
    Edit,
    Failures,
    Outcome,
    classify,
    occurrences,
    parse_failures,
    plant_in_memory,
    replace_once,
    select,
    union_of_catchers,
)
from tests.mutations.defects import DEFECTS
from tests.mutations.plugin import argument_index, argument_prefixes

SOURCE = """def receive():
    return fetch("SELECT seq FROM q FOR UPDATE SKIP LOCKED")
"""


def defect(*edits: Edit, name: str = "planted") -> Defect:
    return Defect(name=name, summary="a test defect", edits=edits, catchers=("tests/unit",))


def test_an_edit_replaces_its_old_text_once() -> None:
    edit = Edit("q.py", " SKIP LOCKED", "")
    assert replace_once(SOURCE, edit) == SOURCE.replace(" SKIP LOCKED", "")


@pytest.mark.parametrize(("old", "found"), [("SKIP LOCKED SKIP", "not found"),
                                            ("re", "found 2 times")])
def test_an_old_text_not_there_exactly_once_is_refused_naming_the_defect_and_file(
    old: str, found: str,
) -> None:
    with pytest.raises(DefectNotApplicable,
                       match=re.escape(f"defect 'planted': the old text is {found} in q.py")):
        replace_once(SOURCE, Edit("q.py", old, "x"), defect="planted")


def test_overlapping_occurrences_count_as_several() -> None:
    assert occurrences("aaa", "aa") == 2
    with pytest.raises(DefectNotApplicable, match="found 2 times"):
        replace_once("aaa", Edit("f", "aa", "b"))


def test_an_empty_or_unchanging_edit_is_refused() -> None:
    with pytest.raises(DefectNotApplicable, match="empty"):
        replace_once(SOURCE, Edit("q.py", "", "x"))
    with pytest.raises(DefectNotApplicable, match="changes nothing"):
        replace_once(SOURCE, Edit("q.py", "FOR UPDATE", "FOR UPDATE"))
    with pytest.raises(DefectNotApplicable, match="no edit"):
        plant_in_memory(defect(), lambda path: SOURCE)


def test_later_edits_of_one_file_see_the_earlier_ones() -> None:
    planted = plant_in_memory(
        defect(Edit("q.py", "SKIP LOCKED", "NOWAIT"), Edit("q.py", "UPDATE NOWAIT", "SHARE")),
        lambda path: SOURCE)
    assert planted == {"q.py": SOURCE.replace("UPDATE SKIP LOCKED", "SHARE")}


def test_a_defect_whose_old_text_is_missing_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    (tmp_path / "q.py").write_text(SOURCE)
    (tmp_path / "other.py").write_text("x = 1\n")
    half = defect(Edit("other.py", "x = 1", "x = 2"),  # would apply
                  Edit("q.py", "FOR SHARE SKIP LOCKED", "FOR SHARE"))  # not in the file
    with pytest.raises(DefectNotApplicable, match=re.escape("not found in q.py")):
        runner.plant(tmp_path, half)
    assert (tmp_path / "other.py").read_text() == "x = 1\n"  # all or nothing
    assert (tmp_path / "q.py").read_text() == SOURCE


def test_planting_keeps_every_other_byte(tmp_path: Path) -> None:
    (tmp_path / "q.sql").write_bytes(b"-- \xc3\xa9\r\nSELECT 1 FOR UPDATE SKIP LOCKED;\r\n")
    runner.plant(tmp_path, defect(Edit("q.sql", " SKIP LOCKED", "")))
    assert (tmp_path / "q.sql").read_bytes() == b"-- \xc3\xa9\r\nSELECT 1 FOR UPDATE;\r\n"


def test_the_script_refuses_a_defect_whose_old_text_is_missing_before_running_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "q.py").write_text(SOURCE)
    stale = defect(Edit("q.py", "FOR SHARE", "FOR UPDATE"), name="stale")
    assert main(["--tests", "targeted"], catalogue=[stale], source=tmp_path) == 2
    captured = capsys.readouterr()
    assert "refused: defect 'stale': the old text is not found in q.py" in captured.err
    assert captured.out == ""  # no JSON: nothing ran


def test_an_unknown_defect_name_is_refused_with_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--defect", "no-such-defect", "--list"]) == 2
    error = capsys.readouterr().err
    assert "unknown defect 'no-such-defect'; known: error-queue-copy-lost" in error


def test_the_list_names_each_defect_its_files_and_catchers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--list", "--defect", "skip-locked-dropped"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("skip-locked-dropped: ")
    assert "files: endpoint_runtime/transport/sql/queue.sql" in listed
    assert "catcher: tests/integration/test_skip_locked.py" in listed


def test_selection_keeps_the_catalogues_order_and_catchers_are_named_once() -> None:
    first, second = defect(name="a"), defect(name="b")
    assert select([first, second], ["b", "a", "b"]) == [first, second]
    assert select([first, second], []) == [first, second]
    assert union_of_catchers([first, second]) == ["tests/unit"]


def test_the_catalogue_has_the_six_defects_each_with_catchers_that_exist() -> None:
    root = runner.REPO_ROOT
    assert len(DEFECTS) >= 6
    assert len({d.name for d in DEFECTS}) == len(DEFECTS)
    for planted in DEFECTS:
        assert planted.catchers, planted.name
        for catcher in planted.catchers:
            assert (root / catcher.split("::", 1)[0]).exists(), catcher


def test_every_defect_plants_in_this_checkout() -> None:
    """A refactor that moves a defect's old text fails here, in the normal suite, before a
    mutation run would refuse it."""
    if os.environ.get(runner.PLANTED_VARIABLE):
        pytest.skip("a mutation run's copy: the planted defect's old text is gone by design")
    root = runner.REPO_ROOT
    for planted in DEFECTS:
        contents = plant_in_memory(planted, lambda path: (root / path).read_text("utf-8"))
        assert set(contents) == set(planted.files)


PYTEST_OUTPUT = """\
..F
=================================== FAILURES ===================================
FAILED is a word a test's output may hold too
=========================== short test summary info ============================
FAILED tests/integration/test_skip_locked.py::test_a_receive[receive_past] - Failed: waited
FAILED tests/e2e/test_x.py::test_y[atomic - with spaces] - assert 3 == 1
FAILED tests/unit/test_z.py::test_no_message
ERROR tests/integration/test_sagas.py::test_setup - asyncpg.exceptions.CannotConnectNowError
ERROR tests/fuzz/test_broken.py
FAILED tests/unit/test_z.py::test_no_message
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
1 failed, 2 passed in 3.21s
"""


def test_the_short_summary_gives_the_failing_and_erroring_test_ids_in_order() -> None:
    failures = parse_failures(PYTEST_OUTPUT)
    assert failures.failed == (
        "tests/integration/test_skip_locked.py::test_a_receive[receive_past]",
        "tests/e2e/test_x.py::test_y[atomic - with spaces]",
        "tests/unit/test_z.py::test_no_message",
    )
    assert failures.errors == ("tests/integration/test_sagas.py::test_setup",
                               "tests/fuzz/test_broken.py")
    assert parse_failures("FAILED before any summary\n3 passed in 1.00s\n") == Failures()


@pytest.mark.parametrize(("status", "outcome"), [
    (1, Outcome.CAUGHT),  # tests failed
    (0, Outcome.MISSED),  # every test passed with the defect planted
    (2, Outcome.ERROR),  # interrupted: a collection error, Ctrl-C
    (3, Outcome.ERROR),  # internal error
    (4, Outcome.ERROR),  # usage error
    (5, Outcome.ERROR),  # no tests collected
    (-9, Outcome.ERROR),  # killed (the run's timeout)
])
def test_only_exit_status_1_is_a_catch(status: int, outcome: Outcome) -> None:
    assert classify(status) is outcome


def test_pytest_runs_in_the_given_order_with_the_options_and_deselections(
    tmp_path: Path,
) -> None:
    command = runner.pytest_command(Path("/venv/bin/python"), ["tests/unit", "tests/e2e"],
                                    stop_first=True, deselect=["tests/unit/test_a.py::t"],
                                    basetemp=tmp_path, xdist=True)
    assert command == ["/venv/bin/python", "-m", "pytest", "-x", "-p", "no:randomly", "-q",
                       "-p", "tests.mutations.plugin", "-n", "0", f"--basetemp={tmp_path}",
                       "--deselect=tests/unit/test_a.py::t",
                       "tests/unit", "tests/e2e"]


def test_the_suite_goes_cheapest_folder_first_and_leaves_no_test_folder_out(
    tmp_path: Path,
) -> None:
    for folder in ("chaos", "unit", "e2e", "support", "newer"):
        (tmp_path / "tests" / folder).mkdir(parents=True)
    (tmp_path / "tests" / "newer" / "test_new.py").write_text("")
    assert runner.suite_targets(tmp_path) == ["tests/unit", "tests/e2e", "tests/chaos",
                                              "tests/newer"]


def test_the_runs_environment_points_at_the_copy_and_away_from_other_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", "postgresql://elsewhere/db")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("PYTHONPATH", "/work/main")
    workspace = runner.Workspace(tmp_path)
    env = runner.child_environment(workspace, "skip-locked-dropped")
    assert env["PYTHONPATH"] == str(tmp_path / "src")
    assert env["ENDPOINT_RUNTIME_DATA_DIR"] == str(tmp_path / "src" / ".endpoint_runtime")
    assert env["RAY_TMPDIR"] == str(tmp_path / "ray")
    assert env[runner.PLANTED_VARIABLE] == "skip-locked-dropped"
    assert "ENDPOINT_RUNTIME_DSN" not in env
    assert "RAY_ADDRESS" not in env
    assert runner.PLANTED_VARIABLE not in runner.child_environment(workspace, None)


def test_each_test_is_placed_by_the_argument_that_selected_it(tmp_path: Path) -> None:
    prefixes = argument_prefixes(
        ["tests/integration/test_a.py::test_x", "tests/e2e/", f"{tmp_path}/tests/unit/b.py"],
        invocation=tmp_path, root=tmp_path)
    assert prefixes == ["tests/integration/test_a.py::test_x", "tests/e2e",
                        "tests/unit/b.py"]
    assert argument_index("tests/integration/test_a.py::test_x[1]", prefixes) == 0
    assert argument_index("tests/integration/test_a.py::test_xy", prefixes) == 3  # no one's
    assert argument_index("tests/e2e/test_c.py::test_y", prefixes) == 1
    assert argument_index("tests/e2e_more/test_c.py::test_y", prefixes) == 3
    assert argument_index("tests/unit/b.py::test_z", prefixes) == 2


def test_the_plugin_runs_the_tests_in_the_command_lines_order_whatever_a_conftest_sorts(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(
        "def pytest_collection_modifyitems(items):\n"
        "    items.sort(key=lambda item: item.nodeid, reverse=True)\n")
    (tmp_path / "test_a.py").write_text("def test_1(): pass\ndef test_2(): pass\n")
    (tmp_path / "test_b.py").write_text("def test_3(): pass\n")
    env = {**os.environ, "PYTHONPATH": str(runner.REPO_ROOT)}
    env.pop(runner.PLANTED_VARIABLE, None)
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
         "-p", "no:cacheprovider", "-p", "tests.mutations.plugin", "test_b.py", "test_a.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert listed.stdout.split()[:3] == ["test_b.py::test_3", "test_a.py::test_1",
                                         "test_a.py::test_2"]


def test_a_run_counts_as_hung_only_once_it_outlives_a_failure_by_the_grace() -> None:
    watch = runner.FailureWatch()
    watch.saw("....", now=10.0)
    assert not watch.hung(1000.0, 120)  # no failure yet: a long test is no hang
    # The plugin's line follows pytest's progress letters on the same line.
    watch.saw("..Fmutations-watch: failed tests/a.py::test_b (call)\n", now=20.0)
    watch.saw("mutations-watch: failed tests/a.py::test_c (teardown)\n", now=30.0)
    assert not watch.hung(140.0, 120)
    assert watch.hung(140.5, 120)
