"""The chaos run at CI size: ``python -m benchmarks.chaos`` with 2,000 messages per mode
(10,000 in all) over a 20 s send stream per mode, as a subprocess.

This is the benchmark itself, not a model of it: it starts its own PostgreSQL (which it
restarts) and its own three-node Ray cluster (whose receivers and peeker it kills), and its
JSON line says where every message went. The test asserts every check of every mode and that
every kind of fault was injected in every mode. A few minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.chaos.endpoints import MODES
from benchmarks.chaos.schedule import FaultKind, PoisonKind

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 2_000
POISON_PER_KIND = 10
CI_ARGS = ["--messages", str(MESSAGES), "--stream-seconds", "20", "--kill-interval", "3",
           "--poison-per-kind", str(POISON_PER_KIND), "--drain-timeout", "180", "--quick"]


@pytest.fixture(scope="module")
def chaos_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    log = tmp_path_factory.mktemp("chaos") / "stderr.log"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    with log.open("wb") as stderr:
        finished = subprocess.run(
            [sys.executable, "-m", "benchmarks.chaos", *CI_ARGS], cwd=ROOT, env=environment,
            stdout=subprocess.PIPE, stderr=stderr, timeout=1100, check=False)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
    assert finished.returncode == 0, tail
    lines = finished.stdout.decode().strip().splitlines()
    assert lines, tail
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr_tail"] = tail
    return result


@pytest.mark.parametrize("mode", MODES)
def test_every_message_is_accounted_for(chaos_result: dict[str, Any], mode: str) -> None:
    result = chaos_result["modes"][mode]
    assert result["failed_checks"] == [], (result, chaos_result["stderr_tail"])
    assert result["sent"] == MESSAGES + POISON_PER_KIND * len(PoisonKind), result
    assert result["sent"] == (result["handled"] + result["error_queue"] + result["expired"]
                              + result["discarded"] + result["lost"]), result
    assert result["expired"] == POISON_PER_KIND, result
    assert result["left_in_queue"] == result["left_in_delayed"] == 0, result
    if mode != "none":
        assert result["lost"] == 0, result
    if mode in ("atomic", "batched", "outbox"):
        assert result["duplicate_effects"] == 0, result
        assert result["ghost_sends"] == 0, result
    assert result["ok"], result


@pytest.mark.parametrize("mode", MODES)
def test_every_kind_of_fault_was_injected(chaos_result: dict[str, Any], mode: str) -> None:
    faults = chaos_result["modes"][mode]["faults"]
    assert faults.get(FaultKind.KILL_RECEIVER, 0) >= 3, faults
    assert faults.get(FaultKind.KILL_PEEKER) == 1, faults
    assert faults.get(FaultKind.RESTART_POSTGRES) == 1, faults
    assert faults.get(FaultKind.TERMINATE_BACKENDS) == 2, faults
    assert faults.get(FaultKind.POISON_BURST) == 1, faults


def test_the_run_says_it_is_ok(chaos_result: dict[str, Any]) -> None:
    assert chaos_result["ok"], chaos_result
    assert set(chaos_result["modes"]) == set(MODES)
