"""The nodes sweep: 1, 2 and 3 Ray nodes on this machine, and receivers per node.

For each node count the harness starts a Ray cluster of its own (a head and workers, each a
``ray start`` with private ports and temp dir: :class:`tests.cluster.nodes.LocalCluster`) and
runs this module as a child process, the cluster's driver (``RAY_ADDRESS`` and the cluster's
token settings in its environment: Ray reads them when it is imported, so a process that ran a
local Ray cannot switch to a cluster). The child drains a single-message atomic backlog with
``per_node`` receivers of :data:`SLOTS` slots on every node (the peeker spreads receivers
evenly over the live nodes; each drain reports how many nodes held receivers), alternating the
per-node counts, and prints its medians as JSON; then the harness stops the cluster's
processes by PID.

On one machine every node shares the same two cores and the same PostgreSQL, so the sweep shows
what spreading costs or gains (placement, more processes and connections), not more compute:
the scaling model in docs/performance.md projects what real nodes would add.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

import asyncpg

from benchmarks.common import progress, run_async
from benchmarks.scaleout.harness import alternate, per_side
from benchmarks.scaleout.runtime_sides import ATOMIC, RuntimeSide
from benchmarks.scaleout.side import Load
from endpoint_runtime.connections.connection_budget import ConnectionBudget, server_capacity
from endpoint_runtime.settings import EndpointSettings, TransportSettings

SLOTS = 4
"""Slots of every receiver in this sweep (the runtime's default)."""


HARNESS_CONNECTIONS = 4
"""Connections the drain itself holds beside the deployment (its pool, the sink's)."""


def fitting(nodes: int, per_node: tuple[int, ...],
            available: int) -> tuple[tuple[int, ...], dict[str, str]]:
    """The receivers-per-node counts whose deployment fits in ``available`` server
    connections, and why each other one was left out (a deployment that cannot fit refuses to
    start: :mod:`endpoint_runtime.connections.connection_budget`)."""
    kept: list[int] = []
    skipped: dict[str, str] = {}
    for count in per_node:
        side = nodes_side(nodes, count)
        settings = EndpointSettings(**side.overrides, transport=TransportSettings(**side.transport))
        needed = ConnectionBudget.of(settings).worst_case + HARNESS_CONNECTIONS
        if needed <= available:
            kept.append(count)
        else:
            skipped[side.name] = (
                f"needs up to {needed} connections, the server has {available} left "
                "(raise max_connections to measure it)")
    return tuple(kept), skipped


def nodes_side(nodes: int, per_node: int) -> RuntimeSide:
    """Single-message atomic mode with ``per_node`` receivers on each of ``nodes`` nodes."""
    receivers = nodes * per_node
    return RuntimeSide(f"nodes_{nodes}_receivers_{per_node}", ATOMIC,
                       {"max_concurrency": receivers * SLOTS, "slots_per_receiver": SLOTS,
                        "min_receivers": receivers})


async def on_cluster(dsn: str, nodes: int, messages: int, per_node: tuple[int, ...],
                     runs: int, log_level: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Start a cluster of ``nodes``, drain on it from a child process, stop it; the child's
    medians per side, and the points left out because they cannot fit the server's
    connections."""
    from tests.cluster.nodes import LocalCluster

    per_node, skipped = fitting(nodes, per_node, await available_connections(dsn))
    for name, why in skipped.items():
        progress(f"[nodes {nodes}] {name} left out: {why}")
    if not per_node:
        return {}, skipped
    cluster = LocalCluster(workers=[{} for _ in range(nodes - 1)], cpus_per_node=2)
    cluster.environment["ENDPOINT_RUNTIME_LOG_LEVEL"] = log_level
    try:
        progress(f"[nodes {nodes}] starting {nodes} Ray node(s)")
        await asyncio.to_thread(cluster.start)
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.scaleout.nodes", "--dsn", dsn, "--nodes",
            str(nodes), "--messages", str(messages), "--runs", str(runs), "--per-node",
            *map(str, per_node), env=cluster.driver_environment(),
            stdout=asyncio.subprocess.PIPE)
        out, _ = await child.communicate()
    finally:
        await asyncio.to_thread(cluster.shutdown)
    if child.returncode != 0:
        raise RuntimeError(f"the nodes driver exited with {child.returncode}")
    sides: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return sides, skipped


async def available_connections(dsn: str) -> int:
    """Client connections the server has left (this probe's own not counted)."""
    connection = await asyncpg.connect(dsn)
    try:
        return (await server_capacity(connection)).available
    finally:
        await connection.close()


async def nodes_sweep(dsn: str, messages: int, node_counts: tuple[int, ...],
                      per_node: tuple[int, ...], runs: int,
                      log_level: str = "warning") -> dict[str, Any]:
    """Drain ``messages`` at every node count and receivers per node; medians per point."""
    sides: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for nodes in node_counts:
        try:
            measured, left_out = await on_cluster(dsn, nodes, messages, per_node, runs,
                                                  log_level)
            sides.update(measured)
            skipped.update(left_out)
        except Exception as exc:  # a cluster that would not start: recorded, not fatal
            errors[str(nodes)] = f"{type(exc).__name__}: {exc}"
            progress(f"[nodes {nodes}] failed: {errors[str(nodes)]}")
    return {"sides": sides, "errors": errors, "skipped": skipped, "slots_per_receiver": SLOTS,
            "by_nodes": by_nodes(sides)}


def by_nodes(sides: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The sweep as ``{receivers per node: {nodes: msg/s}}`` (the plot's lines)."""
    lines: dict[str, dict[str, float]] = {}
    for name, side in sides.items():
        _, nodes, _, per_node = name.split("_")
        lines.setdefault(per_node, {})[nodes] = side["msgs_per_s"]
    return lines


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    """The child's work: alternate the per-node counts on the cluster it is connected to.
    The sides' own settings give each its receivers and slots (the load's concurrency is
    replaced by them)."""
    points = [nodes_side(args.nodes, count) for count in args.per_node]
    results = await alternate(points, args.dsn, Load(args.messages, SLOTS), args.runs,
                              f"nodes {args.nodes}")
    return per_side(results)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the child process (``RAY_ADDRESS`` names the cluster)."""
    import structlog

    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaleout.nodes")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--per-node", type=int, nargs="+", required=True)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(json.dumps(run_async(drive(args))), flush=True)


if __name__ == "__main__":
    main()
