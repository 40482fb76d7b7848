"""The peeker's receivers: their handles, how one is placed and launched, and the Ray helpers
the peeker uses to talk to them."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec
import ray
import structlog
import yaml  # type: ignore[import-untyped]  # Ray depends on PyYAML; no stubs here
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from endpoint_runtime.runtime.actors import scaling
from endpoint_runtime.runtime.actors.crash_ledger import read_ledger_on_node
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig
from endpoint_runtime.runtime.actors.receiver import ReceiverActor, ReceiverConfig, ReceiverStatus
from endpoint_runtime.settings import EndpointSettings

log = structlog.get_logger("endpoint_runtime.peeker")


class ReceiverHandle(msgspec.Struct, kw_only=True):
    """The peeker's view of one receiver actor."""

    receiver_id: str
    actor: Any
    allowance: int = 0
    last: ReceiverStatus | None = None
    critical_errors_seen: int = 0
    node_id: str | None = None
    ledger: str | None = None
    """Its crash ledger's file, on its node."""
    doomed_version: int = 0
    """The version of the doomed ids it has (:class:`DeathCounts`)."""


def receiver_config(deployment: DeploymentConfig, settings: EndpointSettings) -> ReceiverConfig:
    """The configuration of a new receiver of ``deployment``, with an id of its own."""
    return ReceiverConfig(
        endpoint_path=deployment.endpoint_path,
        dsn=deployment.dsn,
        settings=settings,
        receiver_id=f"{deployment.endpoint_name}-{uuid.uuid4().hex[:8]}",
        deployment_id=deployment.deployment_id,  # its committed counts are kept under it
        otel_environment=deployment.otel_environment,
    )


def launch_receiver(
    deployment: DeploymentConfig, settings: EndpointSettings, node_id: str | None
) -> ReceiverHandle:
    """Create a receiver actor of ``deployment`` (not started yet: its ``start`` is the
    caller's), placed on ``node_id`` when given."""
    config = receiver_config(deployment, settings)
    receiver_id = config.receiver_id
    # Placement: on ``node_id``, the live node (among those with the custom resources asked
    # for, if any) with the fewest receivers; the resources are still requested, so Ray
    # counts them. Hard affinity: Ray's soft affinity moved receivers to other nodes now and
    # then; if the node is gone, the start fails and the next cycle places the receiver on a
    # live node. Never restarted by Ray: the peeker replaces dead receivers itself.
    placement: dict[str, Any] = {"scheduling_strategy": "SPREAD"}
    if node_id is not None:
        placement = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
    if settings.receiver_resources:
        placement["resources"] = dict(settings.receiver_resources)
    actor = ReceiverActor.options(
        num_cpus=settings.receiver_num_cpus, max_restarts=0, **placement,
    ).remote(config)
    log.info("receiver_launched", receiver=receiver_id, node=(node_id or "?")[:12])
    return ReceiverHandle(receiver_id=receiver_id, actor=actor, node_id=node_id)


def live_nodes(resources: Mapping[str, float] | None = None) -> list[str]:
    """Ids of the nodes Ray counts alive (with at least ``resources`` in all, when given),
    in a stable order."""
    return sorted(node["NodeID"] for node in ray.nodes()  # type: ignore[no-untyped-call]
                  if node.get("Alive") and scaling.has_resources(node["Resources"],
                                                                 resources or {}))


AUTOSCALER_CONFIG = Path("~/ray_bootstrap_config.yaml")
"""Where ``ray up`` puts the autoscaler's configuration on the head (Ray Tune looks for it
there too)."""


def autoscaler_node_types(config: Path = AUTOSCALER_CONFIG) -> dict[str, dict[str, float]]:
    """The resources each node type of the autoscaler's configuration declares
    (``available_node_types.*.resources``); empty when this machine has no such file (not
    the head of a ``ray up`` cluster) or it cannot be read. The local provider's node type
    declares none: its nodes' resources are in their ``ray start`` commands."""
    try:
        document = yaml.safe_load(config.expanduser().read_text())
    except (OSError, yaml.YAMLError):
        return {}
    node_types = (document or {}).get("available_node_types") or {}
    found: dict[str, dict[str, float]] = {}
    for name, node_type in node_types.items():
        resources = (node_type or {}).get("resources") or {}
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            found[str(name)] = {str(k): float(v) for k, v in resources.items()}
    return found


def node_alive(node_id: str) -> bool:
    """Whether Ray's control store still counts ``node_id`` among the live nodes."""
    return any(node.get("NodeID") == node_id and node.get("Alive")
               for node in ray.nodes())  # type: ignore[no-untyped-call]


def last_line(error: BaseException) -> str:
    """Ray wraps errors in long tracebacks; the exception itself is at the end."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1][:1000] if lines else repr(error)


async def await_ref(object_ref: Any) -> Any:
    """Await a Ray ObjectRef (kept in one place so timeouts wrap a coroutine)."""
    return await object_ref


class ReceiverHosting(Protocol):
    """Where a peeker's receivers run and how it talks to them: Ray actors over the cluster's
    nodes (:class:`RayReceivers`, every deployment), or plain objects on the peeker's own event
    loop (:class:`endpoint_runtime.runtime.in_process.InProcessReceivers`)."""

    lost: tuple[type[BaseException], ...]
    """What a call to a receiver that died raises."""
    own_process: bool
    """The peeker and each receiver have a process of their own (so they configure its
    logging and tune its collector); ``False`` in the caller's process, whose settings stay."""

    def launch(self, deployment: DeploymentConfig, settings: EndpointSettings,
               node_id: str | None) -> ReceiverHandle:
        """A new receiver, not started yet (its ``start`` is the caller's)."""
        ...

    async def call(self, handle: ReceiverHandle, method: str, *args: Any) -> Any:
        """The receiver's ``method`` with ``args``, awaited."""
        ...

    def kill(self, handle: ReceiverHandle) -> None:
        """End the receiver now (after its drain, or when it failed to start)."""
        ...

    def live_nodes(self, resources: Mapping[str, float] | None) -> list[str]:
        ...

    def node_alive(self, node_id: str) -> bool:
        ...

    async def read_ledger(self, node_id: str, path: str) -> list[uuid.UUID]:
        """The ids a dead receiver's crash ledger holds, read on its node."""
        ...

    def this_node(self) -> str:
        """The node the peeker runs on."""
        ...


class RayReceivers:
    """Receivers as Ray actors, placed over the nodes (:func:`launch_receiver`)."""

    lost: tuple[type[BaseException], ...] = (ray.exceptions.RayActorError,)
    own_process = True

    def launch(self, deployment: DeploymentConfig, settings: EndpointSettings,
               node_id: str | None) -> ReceiverHandle:
        return launch_receiver(deployment, settings, node_id)

    async def call(self, handle: ReceiverHandle, method: str, *args: Any) -> Any:
        return await getattr(handle.actor, method).remote(*args)

    def kill(self, handle: ReceiverHandle) -> None:
        ray.kill(handle.actor, no_restart=True)

    def live_nodes(self, resources: Mapping[str, float] | None) -> list[str]:
        return live_nodes(resources)

    def node_alive(self, node_id: str) -> bool:
        return node_alive(node_id)

    async def read_ledger(self, node_id: str, path: str) -> list[uuid.UUID]:
        return await read_ledger_on_node(node_id, path)

    def this_node(self) -> str:
        return str(ray.get_runtime_context().get_node_id())
