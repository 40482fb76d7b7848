"""The suite's early-started command (``tests/support/early_run.py``), on short commands."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.early_run import EarlyRun


def test_a_run_started_early_gives_its_output_status_and_errors(tmp_path: Path) -> None:
    run = EarlyRun([sys.executable, "-c", "import sys; print('{\"ok\": 1}'); "
                    "print('said on stderr', file=sys.stderr); sys.exit(3)"],
                   cwd=tmp_path, timeout=60)
    run.start()
    run.start()  # a second start does nothing
    finished = run.finished()
    run.stop()
    assert finished.returncode == 3
    assert finished.stdout.strip() == '{"ok": 1}'
    assert finished.stderr_tail == "said on stderr"


def test_a_run_nobody_started_starts_when_its_result_is_asked_for(tmp_path: Path) -> None:
    run = EarlyRun([sys.executable, "-c", "print('late')"], cwd=tmp_path, timeout=60)
    assert not run.started
    assert run.finished().stdout.strip() == "late"
    run.stop()


def test_a_run_past_its_deadline_is_killed_and_the_wait_fails(tmp_path: Path) -> None:
    run = EarlyRun([sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path,
                   timeout=0.5)
    with pytest.raises(AssertionError, match=r"did not end within 0\.5 s"):
        run.finished()
    run.stop()
