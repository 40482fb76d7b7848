"""Deploy endpoints on a Ray cluster, run them, and say what each node did.

The script that ``ray submit``, ``ray job submit`` and a plain ``python`` on a machine of the
cluster all run (see docs/cluster.md)::

    ray submit ray_cluster.yaml endpoint_runtime/submit.py -- \\
        handlers_examples.sales:endpoint --nodes 3 --duration 600
    python -m endpoint_runtime.submit handlers_examples.sales:endpoint --until-empty

It connects to ``RAY_ADDRESS`` (else starts a local Ray), waits until ``--nodes`` nodes are
alive, deploys each endpoint against the configured PostgreSQL (``ENDPOINT_RUNTIME_DSN``,
``--config``), logs a status line per endpoint every ``--status-interval`` seconds, and runs
until SIGINT/SIGTERM, ``--duration`` seconds, or (``--until-empty``) every queue is empty with
nothing in flight. A peeker lost with its node is recreated on a surviving node. At the end it
prints, per node, the receivers that ran there and the messages they processed, and a last
line ``submit_result {json}`` for scripts. Exit status 0; 1 when a deployment could not be
kept running or halted on a critical error; 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

import msgspec
import structlog

from endpoint_runtime.actors.cluster import ensure_ray
from endpoint_runtime.actors.deployment_status import DeploymentStatus
from endpoint_runtime.cli.common import positive_float, positive_int
from endpoint_runtime.cli.run import merged_transport
from endpoint_runtime.connecting import PostgresTransport
from endpoint_runtime.deployment import EndpointDeployment
from endpoint_runtime.endpoint import load_endpoint
from endpoint_runtime.errors import EndpointRuntimeError
from endpoint_runtime.logging import configure_logging

log = structlog.get_logger("endpoint_runtime.submit")


class NodeReport(msgspec.Struct, kw_only=True):
    """What one Ray node did during the run."""

    node_id: str
    address: str
    alive: bool
    receivers: int = 0
    """Receivers that ran on it (over the whole run)."""
    processed: int = 0
    """Messages its receivers processed (as far as their last status said)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_runtime.submit",
        description="Deploy endpoints on the Ray cluster (RAY_ADDRESS) against the configured "
        "PostgreSQL, run them, and print what each node did.",
    )
    parser.add_argument("endpoints", nargs="+", metavar="MODULE:ATTR",
                        help="the Endpoints to deploy, e.g. handlers_examples.sales:endpoint")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML settings file (its [transport] table is read)")
    parser.add_argument("--nodes", type=positive_int, default=1, metavar="N",
                        help="wait until the cluster has N live nodes (default 1)")
    parser.add_argument("--nodes-timeout", type=positive_float, default=300.0, metavar="S",
                        help="give up waiting for the nodes after S seconds (default 300)")
    parser.add_argument("--duration", type=positive_float, default=None, metavar="S",
                        help="stop after S seconds (default: until SIGINT/SIGTERM)")
    parser.add_argument("--until-empty", action="store_true",
                        help="stop once every endpoint's queue is empty and nothing is in flight")
    parser.add_argument("--max-concurrency", type=positive_int, metavar="N",
                        help="most messages in flight per deployment")
    parser.add_argument("--receiver-resources", type=_resources, default=None, metavar="JSON",
                        help='pin receivers to nodes with these Ray resources, e.g. '
                        '\'{"queue_workers": 1}\' (default: spread over every node)')
    parser.add_argument("--peeker-resources", type=_resources, default=None, metavar="JSON",
                        help="run the peekers on a node with these Ray resources")
    parser.add_argument("--status-interval", type=positive_float, default=5.0, metavar="S",
                        help="seconds between status lines (default 5)")
    return parser


def _resources(text: str) -> dict[str, float]:
    try:
        value = msgspec.json.decode(text, type=dict[str, float])
    except msgspec.DecodeError as exc:
        raise argparse.ArgumentTypeError(f"not a JSON object of numbers: {exc}") from exc
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(os.environ.get("ENDPOINT_RUNTIME_LOG_LEVEL", "info"))
    # Like `python -m`: modules of the current directory can be named.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return asyncio.run(submit(args))
    except EndpointRuntimeError as exc:
        print(f"submit: error: {exc}", file=sys.stderr)
        return 2


async def submit(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    # In the main thread, never a worker thread: a local Ray's GCS server and raylet die with
    # the thread that started them (see cli.run), which a thread pool ends.
    ensure_ray()
    import ray

    # After ray.init, which installs its own SIGTERM handler.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_requested.set)
    nodes = await _wait_for_nodes(args.nodes, args.nodes_timeout)
    if nodes is None:
        return 1
    started = time.monotonic()
    deployments: list[EndpointDeployment] = []
    tracker = _Tracker()
    exit_code = 0
    try:
        for path in args.endpoints:
            endpoint = load_endpoint(path)
            overrides: dict[str, Any] = {
                "transport": merged_transport(endpoint, args.config)}
            if args.max_concurrency is not None:
                overrides["max_concurrency"] = args.max_concurrency
            if args.receiver_resources is not None:
                overrides["receiver_resources"] = args.receiver_resources
            deployment = await EndpointDeployment.start(
                path, peeker_resources=args.peeker_resources, **overrides)
            deployments.append(deployment)
            print(f"deployed {path} (peeker on node "
                  f"{(await deployment.node_of_peeker())[:12]})", flush=True)
        transport_settings = deployments[0].config.settings.transport
        async with PostgresTransport.connect(transport_settings) as transport:
            while not stop_requested.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_requested.wait(), args.status_interval)
                idle = True
                for deployment in deployments:
                    try:
                        status = await deployment.supervised_status()
                    except ray.exceptions.RayActorError:
                        return 1  # logged by the supervisor; `finally` stops the others
                    tracker.record(deployment, status)
                    if status.halted:
                        log.error("endpoint_halted", endpoint=status.endpoint)
                        exit_code = 1
                        stop_requested.set()
                    depth = await transport.depth(deployment.config.address)
                    idle = idle and depth == 0 and status.in_flight == 0
                    log.info("endpoint_status", endpoint=status.endpoint, depth=depth,
                             receivers=len(status.receivers),
                             receivers_by_node=_short(status.receivers_by_node),
                             processed=status.processed, restarts=deployment.restarts)
                elapsed = time.monotonic() - started
                if (args.duration is not None and elapsed >= args.duration) or (
                        args.until_empty and idle):
                    break
    finally:
        for deployment in deployments:
            try:
                final = await deployment.stop()
            except ray.exceptions.RayError as exc:
                log.error("stop_failed", endpoint=deployment.config.endpoint_name,
                          error=str(exc).strip().splitlines()[-1][:300])
                continue
            tracker.record(deployment, final)
    _print_report(tracker, deployments, time.monotonic() - started)
    return exit_code


async def _wait_for_nodes(count: int, timeout: float) -> list[dict[str, Any]] | None:  # noqa: ASYNC109
    import ray

    deadline = time.monotonic() + timeout
    while True:
        alive = [n for n in await asyncio.to_thread(ray.nodes) if n.get("Alive")]
        if len(alive) >= count:
            for node in alive:
                print(f"node {node['NodeID'][:12]} {node['NodeManagerAddress']} "
                      f"resources={_node_resources(node)}", flush=True)
            return alive
        if time.monotonic() >= deadline:
            print(f"submit: only {len(alive)} of {count} nodes alive after {timeout:.0f} s",
                  file=sys.stderr)
            return None
        log.info("waiting_for_nodes", alive=len(alive), wanted=count)
        await asyncio.sleep(2.0)


class _Tracker:
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


def _print_report(tracker: _Tracker, deployments: list[EndpointDeployment],
                  seconds: float) -> None:
    import ray

    processed = tracker.processed()
    reports = []
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        node_id = node["NodeID"]
        reports.append(NodeReport(
            node_id=node_id, address=node["NodeManagerAddress"], alive=bool(node.get("Alive")),
            receivers=len(tracker.receivers.get(node_id, ())),
            processed=processed.get(node_id, 0),
        ))
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
        "nodes": [msgspec.to_builtins(r) for r in reports],
    }
    print("submit_result " + json.dumps(result), flush=True)


def _node_resources(node: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in node.get("Resources", {}).items()
            if not k.startswith("node:") and "memory" not in k}


def _short(by_node: dict[str, int]) -> dict[str, int]:
    return {node[:8]: count for node, count in by_node.items()}


if __name__ == "__main__":
    # `ray submit` copies this file to the head's home directory and runs it as a script;
    # the package comes from the installation there (the cluster's setup commands).
    sys.exit(main())
