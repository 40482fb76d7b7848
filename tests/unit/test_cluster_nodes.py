"""The three-node test cluster's restart of a node (tests/cluster/nodes.py): a failed
``ray start`` is tried again after its leftovers are killed, and given up after
NODE_START_ATTEMPTS. The real starts run in tests/cluster; here they are planted."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.cluster import nodes
from tests.cluster.nodes import LocalCluster


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(workers=[{"node_b": 1}])  # nothing started: only its temp dir
    yield cluster
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def test_a_failed_start_is_tried_again_after_its_leftovers_are_killed(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    failures = iter([RuntimeError("ray start of node 1 failed: timed out during startup")])

    def start(index: int) -> None:
        calls.append(f"start {index}")
        if (failure := next(failures, None)) is not None:
            raise failure

    monkeypatch.setattr(cluster, "_start_node", start)
    monkeypatch.setattr(cluster, "_kill_raylet", lambda index: calls.append(f"kill {index}"))
    cluster.restart_node(1)
    assert calls == ["kill 1", "start 1", "kill 1", "start 1"]


def test_a_start_that_keeps_failing_is_given_up(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts: list[int] = []

    def start(index: int) -> None:
        starts.append(index)
        raise RuntimeError("ray start of node 1 failed")

    monkeypatch.setattr(cluster, "_start_node", start)
    monkeypatch.setattr(cluster, "_kill_raylet", lambda index: None)
    with pytest.raises(RuntimeError, match="ray start of node 1 failed"):
        cluster.restart_node(1)
    assert starts == [1] * nodes.NODE_START_ATTEMPTS
