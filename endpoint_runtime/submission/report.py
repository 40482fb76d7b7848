"""What each node did during a run of the submit script: the lines it prints at the end.

Example of the output::

    node 1ce798a2f0a4 127.0.0.1       alive receivers=1   processed=412
    submit_result {"seconds": 31.5, "restarts": 0, "processed": 1000, ...}
"""

from __future__ import annotations

import collections
import json
from typing import Any

import msgspec

from endpoint_runtime.runtime.actors.deployment_status import DeploymentStatus
from endpoint_runtime.runtime.deployment import EndpointDeployment


class NodeReport(msgspec.Struct, kw_only=True):
    """What one Ray node did during the run."""

    node_id: str
    address: str
    alive: bool
    receivers: int = 0
    """Receivers that ran on it (over the whole run)."""
    processed: int = 0
    """Messages its receivers processed."""


class Tracker:
    """Receivers, processed counts per node and replaced receivers over the whole run,
    across peeker restarts (a new peeker counts from zero: what the lost one had counted is
    carried over, as of its last status)."""

    def __init__(self) -> None:
        self.receivers: dict[str, set[str]] = collections.defaultdict(set)
        self._carried: dict[int, collections.Counter[str]] = {}
        self._carried_replaced: collections.Counter[int] = collections.Counter()
        self._last: dict[int, tuple[int, DeploymentStatus]] = {}

    def record(self, deployment: EndpointDeployment, status: DeploymentStatus) -> None:
        key = id(deployment)
        carried = self._carried.setdefault(key, collections.Counter())
        previous = self._last.get(key)
        if previous is not None and previous[0] != deployment.restarts:
            carried.update(previous[1].processed_by_node)
            self._carried_replaced[key] += previous[1].replaced_receivers
        self._last[key] = (deployment.restarts, status)
        for receiver in status.receivers:
            self.receivers[receiver.node_id].add(receiver.receiver_id)

    def processed(self) -> collections.Counter[str]:
        """Messages processed per node as the peekers' last statuses say (a status of a
        peeker lost with its node may be stale)."""
        total: collections.Counter[str] = collections.Counter()
        for key, carried in self._carried.items():
            total.update(carried)
            total.update(self._last[key][1].processed_by_node)
        return total

    @property
    def replaced(self) -> int:
        """Dead receivers the peekers replaced."""
        return sum(self._carried_replaced.values()) + sum(
            status.replaced_receivers for _, status in self._last.values())


def print_report(tracker: Tracker, deployments: list[EndpointDeployment], seconds: float,
                 processed: collections.Counter[str], nodes: list[dict[str, Any]],
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Print a line per node and the ``submit_result`` line; return the result.
    ``processed``: messages per Ray node id (a node Ray no longer lists gets a line of its
    own); ``nodes``: ``ray.nodes()``."""
    reports = [
        NodeReport(
            node_id=node["NodeID"], address=node["NodeManagerAddress"],
            alive=bool(node.get("Alive")),
            receivers=len(tracker.receivers.get(node["NodeID"], ())),
            processed=processed.get(node["NodeID"], 0),
        )
        for node in nodes
    ]
    known = {node["NodeID"] for node in nodes}
    reports += [NodeReport(node_id=node_id, address="?", alive=False, processed=count)
                for node_id, count in sorted(processed.items()) if node_id not in known]
    print(f"ran {seconds:.1f} s; endpoints: "
          + ", ".join(d.config.endpoint_name for d in deployments), flush=True)
    for report in reports:
        state = "alive" if report.alive else "dead"
        print(f"node {report.node_id[:12]} {report.address:<15} {state:<5} "
              f"receivers={report.receivers:<3} processed={report.processed}", flush=True)
    result = {
        "seconds": round(seconds, 1),
        "restarts": sum(d.restarts for d in deployments),
        "replaced_receivers": tracker.replaced,
        "processed": sum(processed.values()),
        **(extra or {}),
        "nodes": [msgspec.to_builtins(r) for r in reports],
    }
    print("submit_result " + json.dumps(result), flush=True)
    return result


def short(by_node: dict[str, int]) -> dict[str, int]:
    """Node ids cut to 8 characters, for status lines."""
    return {node[:8]: count for node, count in by_node.items()}
