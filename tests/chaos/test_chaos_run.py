"""The chaos run at CI size: ``python -m benchmarks.chaos`` with 2,000 messages per mode
(10,000 in all) over a 20 s send stream per mode, as a subprocess; twice: with the runtime's
connections going to the server directly, and through a PgBouncer in transaction mode that
the run starts and restarts twice per mode (``--pooler``).

This is the benchmark itself, not a model of it: it starts its own PostgreSQL (which it
restarts) and its own three-node Ray cluster (whose receivers and peeker it kills), and its
JSON line says where every message went. The test asserts every check of every mode and that
every kind of fault was injected in every mode. A few minutes on a 2-core machine.

The same run is the checks' self-test: in one mode (:data:`PLANTED_MODE`) it deletes
:data:`PLANTED` queued messages and writes a second effect for :data:`PLANTED` handled ones
behind the runtime's back; that mode must fail exactly those checks, naming exactly the
planted ids, while every other check of that mode still holds.

These tests are one unit of work of the suite's workers, handed out last
(``tests/conftest.py``): the run gets a machine that the other tests have (nearly) left.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.chaos.endpoints import MODES, SAGA_MODES
from benchmarks.chaos.schedule import FaultKind, PoisonKind
from tests.chaos.ci_run import (
    LAYOUTS,
    MESSAGES,
    PLANTED,
    PLANTED_MODE,
    POISON_PER_KIND,
    chaos_run,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def chaos_result(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The session's chaos run of a layout, started now and waited for."""
    finished = chaos_run(request.config, request.param).finished()
    assert finished.returncode == 0, finished.stderr_tail
    lines = finished.stdout.strip().splitlines()
    assert lines, finished.stderr_tail
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr_tail"] = finished.stderr_tail
    return result


@pytest.mark.parametrize("mode", MODES)
def test_every_message_is_accounted_for(chaos_result: dict[str, Any], mode: str) -> None:
    result = chaos_result["modes"][mode]
    planted = mode == PLANTED_MODE
    expected_failures = ["duplicate_effects == 0", "lost == lost_traced"] if planted else []
    # pytest shortens a long dict in its report: the fields that say why come first, whole.
    why = {key: result.get(key) for key in ("failed_checks", "twice_ids", "twice_why",
                                            "untraced_lost_ids", "mismatches", "duplicate_ids",
                                            "in_both", "handled_then_cut")}
    if result["failed_checks"] != expected_failures:
        # pytest cuts a long assertion message short under -q (CI): the whole of it goes to
        # the captured output, which a failed test's report prints in full.
        print(json.dumps(why), json.dumps(result), chaos_result["stderr_tail"], sep="\n")
    assert result["failed_checks"] == expected_failures, (
        json.dumps(why), result, chaos_result["stderr_tail"])
    assert result["sent"] == MESSAGES + POISON_PER_KIND * len(PoisonKind), result
    # An id handled and then cut (none mode: its effect committed, its attempt failed, the
    # error queue has the copy) is counted in both and placed once, as handled.
    assert result["sent"] == (result["handled"] + result["error_queue"] + result["expired"]
                              + result["discarded"] + result["lost"]
                              - result["handled_then_cut"]), result
    assert result["fate_mismatches"] == result["accounted_twice"] == 0, result
    assert result["expired"] == POISON_PER_KIND, result
    assert result["left_in_queue"] == result["left_in_delayed"] == 0, result
    if mode == "none":  # at most once: only messages in hand when a fault cut them
        assert result["lost"] == result["lost_traced"] + (PLANTED if planted else 0), result
    else:
        assert result["lost"] == 0, result
        assert result["lost_sends"] == 0, result
    assert result["duplicate_effects"] == (PLANTED if planted else 0), result
    if mode in ("atomic", "batched", "outbox"):
        assert result["ghost_sends"] == 0, result
    if mode in SAGA_MODES:  # the saga instances hold every committed effect's id once
        assert result["saga_updates"] == result["handled"], result
        assert result["saga_lost_updates"] == result["saga_doubled_updates"] == 0, result
        assert result["saga_misplaced_updates"] == 0, result
    assert result["ok"] is not planted, result


def test_the_planted_faults_fail_their_checks_naming_the_planted_ids(
        chaos_result: dict[str, Any]) -> None:
    result = chaos_result["modes"][PLANTED_MODE]
    planted = result["planted"]
    assert len(planted["loss"]) == len(planted["duplicate"]) == PLANTED, result
    assert result["untraced_lost_ids"] == planted["loss"], result
    assert set(planted["loss"]) <= set(result["lost_ids"]), result
    assert result["duplicate_ids"] == planted["duplicate"], result
    assert not result["ok"], result


@pytest.mark.parametrize("mode", MODES)
def test_every_kind_of_fault_was_injected(chaos_result: dict[str, Any], mode: str) -> None:
    faults = chaos_result["modes"][mode]["faults"]
    assert faults.get(FaultKind.KILL_RECEIVER, 0) >= 3, faults
    assert faults.get(FaultKind.KILL_PEEKER) == 1, faults
    assert faults.get(FaultKind.RESTART_POSTGRES) == 1, faults
    assert faults.get(FaultKind.TERMINATE_BACKENDS) == 2, faults
    assert faults.get(FaultKind.POISON_BURST) == 1, faults
    pooled = chaos_result["pooler"] is not None
    assert faults.get(FaultKind.RESTART_POOLER, 0) == (2 if pooled else 0), faults


def test_the_run_is_ok_but_for_its_planted_mode(chaos_result: dict[str, Any]) -> None:
    assert set(chaos_result["modes"]) == set(MODES)
    assert chaos_result["fate_mismatches"] == 0, chaos_result
    assert [mode for mode, result in chaos_result["modes"].items() if not result["ok"]] == [
        PLANTED_MODE], chaos_result
    assert chaos_result["ok"] is False, chaos_result
