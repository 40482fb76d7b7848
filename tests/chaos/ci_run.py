"""The chaos run at CI size, as the suite runs it: its arguments, and one run per test session
and layout (``tests/support/early_run.py``), started by the fixture of the tests that read it:
``direct`` (the runtime's connections to the server) and ``pooled`` (through a PgBouncer of
the run's own in transaction mode, restarted twice in each mode: ``--pooler``), one after
the other."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.early_run import EarlyRun

ROOT = Path(__file__).resolve().parents[2]
TEST_FILE = Path(__file__).with_name("test_chaos_run.py")
"""The tests that read the run."""
MESSAGES = 2_000
POISON_PER_KIND = 10
PLANTED = 3
PLANTED_MODE = "none"
"""The mode whose loss check is the subtlest: it may lose messages by design, only those a
fault cut in hand (traced through the receive trigger); a message deleted behind its back
must still fail it. Its duplicate effects (at most once) are checked as in every mode."""
CI_ARGS = ["--messages", str(MESSAGES), "--stream-seconds", "20", "--kill-interval", "3",
           "--poison-per-kind", str(POISON_PER_KIND), "--drain-timeout", "180", "--quick",
           "--plant-loss", str(PLANTED), "--plant-duplicate", str(PLANTED),
           "--plant-modes", PLANTED_MODE]
LAYOUTS: dict[str, list[str]] = {"direct": [], "pooled": ["--pooler"]}
"""The runs' layouts and the arguments each adds."""
TIMEOUT_S = 1100

_RUNS = pytest.StashKey[dict[str, EarlyRun]]()


def chaos_run(config: pytest.Config, layout: str = "direct") -> EarlyRun:
    """The session's chaos run of ``layout`` (not started until something starts it)."""
    runs = config.stash.setdefault(_RUNS, {})
    if layout not in runs:
        runs[layout] = EarlyRun(
            [sys.executable, "-m", "benchmarks.chaos", *CI_ARGS, *LAYOUTS[layout]],
            cwd=ROOT, timeout=TIMEOUT_S)
    return runs[layout]


def stop(config: pytest.Config) -> None:
    """Kill the session's runs that still run; remove their files."""
    for run in config.stash.get(_RUNS, {}).values():
        run.stop()
