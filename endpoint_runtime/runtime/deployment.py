"""Running an endpoint on Ray: the driver-side handle of one deployment.

Example::

    deployment = await EndpointDeployment.start("handlers_examples.sales:endpoint")
    print(await deployment.status())
    await deployment.stop()

Several deployments of one endpoint (two processes, two clusters) may run at once: they
compete on the same queue safely, each message taken once (SKIP LOCKED).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

from endpoint_runtime.chain.subscriptions import subscription_store
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.connection_budget import (
    ConnectionBudget,
    check_connection_budget,
    reservation,
    reserving_dsn,
)
from endpoint_runtime.connections.embedded import RedactedDsn, resolve_dsn
from endpoint_runtime.database import installation
from endpoint_runtime.errors import ConfigurationError, ResourcesUnavailableError
from endpoint_runtime.redaction import OtelEnvironment
from endpoint_runtime.runtime.actors import scaling
from endpoint_runtime.runtime.actors.cluster import ensure_ray
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig, DeploymentStatus
from endpoint_runtime.runtime.actors.peeker import PeekerActor
from endpoint_runtime.runtime.actors.receiver_handles import autoscaler_node_types, live_nodes
from endpoint_runtime.runtime.endpoint import Endpoint, load_endpoint
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.settings import replace as replace_settings
from endpoint_runtime.transport.addresses import QueueAddress

log = structlog.get_logger("endpoint_runtime.runtime.deployment")

RESTART_TIMEOUT_SECONDS = 120.0
"""How long a restart may wait for the cluster to place and start a new peeker."""

PINNED_RESTART_SECONDS = 30.0
"""How long a restart waits for a peeker pinned by ``peeker_resources`` to be placed on a node
with them before it starts the peeker anywhere. A node lost a moment ago may still be listed
alive (Ray notices a vanished raylet by its health checks, some seconds later): a peeker asked
of it would wait for ever."""


class EndpointDeployment:
    """A running endpoint: one PeekerActor and the ReceiverActors it manages."""

    def __init__(self, config: DeploymentConfig, peeker: Any,
                 peeker_resources: dict[str, float] | None = None) -> None:
        self.config = config
        self.peeker = peeker
        self.peeker_resources = peeker_resources
        self.restarts = 0
        """Times :meth:`restart` recreated the peeker."""
        self.restarting = False
        """A :meth:`restart` is under way (the driver's status lines say so)."""
        self.attempts = 0
        """Peekers created by :meth:`restart`, placed or not: each has a name of its own."""
        self.stopped = False
        """:meth:`stop` ran."""

    @classmethod
    async def start(
        cls,
        endpoint: str | Endpoint,
        *,
        settings: EndpointSettings | None = None,
        peeker_resources: dict[str, float] | None = None,
        prepared: bool = False,
        **overrides: Any,
    ) -> EndpointDeployment:
        """Create the endpoint's queues and tables (or, without installers, check that they
        exist: see :mod:`endpoint_runtime.database.installation`), then start its peeker (which
        starts
        receivers).

        ``endpoint`` is an Endpoint defined at module level, or its ``module:attribute`` path.
        Setting overrides (e.g. ``max_concurrency=4``) apply to this deployment only.
        ``peeker_resources``: Ray custom resources the peeker requires (the node it runs on);
        by default it runs on the driver's node. Receivers are placed by the settings'
        ``receiver_resources`` (default: spread over the nodes). A resource that no live node
        (nor a node type of the autoscaler's configuration) has raises
        :class:`ResourcesUnavailableError` at once. ``prepared``: :func:`prepare_endpoint` ran
        already (tables and subscriptions are there).
        """
        async def placeable(settings: EndpointSettings) -> None:
            ensure_ray()  # in this thread: Ray installs its signal handlers in the main thread
            await asyncio.to_thread(check_placement, settings, peeker_resources)

        config = await deployment_config(endpoint, settings, prepared=prepared,
                                         before_budget=placeable, **overrides)
        peeker = await _start_peeker(config, peeker_resources)
        log.info("endpoint_started", endpoint=config.endpoint_name, path=config.endpoint_path,
                 mode=config.settings.mode.value, max_concurrency=config.settings.max_concurrency)
        return cls(config, peeker, peeker_resources)

    async def restart(self) -> None:
        """Start a new peeker (with new receivers) after this one was lost, e.g. with the
        node it ran on. The old peeker's receivers die with it (Ray ends the actors an actor
        created when it dies), so their in-flight messages roll back and come again; the
        queues and tables exist already. The deployment keeps its ``deployment_id`` (the
        committed counts of :mod:`endpoint_runtime.runtime.actors.committed_counts` go on from where
        they were); the peeker's own counts start again from zero."""
        self.restarting = True
        try:
            await self._restart()
        finally:
            self.restarting = False

    async def _restart(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.peeker, no_restart=True)
        resources = self.peeker_resources
        if resources and not await asyncio.to_thread(_some_live_node_has, resources):
            # Pinned to the node that was lost: anywhere is better than waiting for it.
            log.warning("peeker_placement_unavailable", resources=resources)
            resources = None
        if resources:
            try:
                self.peeker = await self._start_peeker(resources, PINNED_RESTART_SECONDS)
            except TimeoutError:
                log.warning("peeker_placement_unavailable", resources=resources,
                            waited_seconds=PINNED_RESTART_SECONDS)
                resources = None
        if not resources:
            self.peeker = await self._start_peeker(None, None)
        self.restarts += 1
        log.warning("endpoint_restarted", endpoint=self.config.endpoint_name,
                    restarts=self.restarts)

    async def _start_peeker(self, resources: dict[str, float] | None,
                            timeout: float | None) -> Any:  # noqa: ASYNC109
        self.attempts += 1
        return await _start_peeker(self.config, resources, self.attempts, timeout)

    async def status(self, refresh: bool = False) -> DeploymentStatus:
        """Status of the peeker and its receivers; by default as of the last peek cycle,
        with ``refresh=True`` as of now (one Ray call per receiver)."""
        status: DeploymentStatus = await self.peeker.status.remote(refresh)
        return status

    async def set_max_concurrency(self, max_concurrency: int) -> None:
        await self.peeker.set_max_concurrency.remote(max_concurrency)

    async def receiver_pids(self) -> list[int]:
        pids: list[int] = await self.peeker.receiver_pids.remote()
        return pids

    async def supervised_status(self, *, attempts: int = 5,
                                pause: float = 5.0) -> DeploymentStatus:
        """:meth:`status`, recreating the peeker first when it is gone (its node lost): the
        supervisor of ``endpoint-runtime run`` and ``python -m endpoint_runtime.submit``.
        Raises the last error when ``attempts`` restarts in a row fail."""
        import ray

        for attempt in range(1, attempts + 1):
            try:
                return await self.status()
            except ray.exceptions.RayActorError as exc:
                log.error("peeker_lost", endpoint=self.config.endpoint_name,
                          error=str(exc).strip().splitlines()[-1][:500], attempt=attempt)
                if attempt == attempts:
                    raise
            try:
                await asyncio.wait_for(self.restart(), RESTART_TIMEOUT_SECONDS)
            except (ray.exceptions.RayError, TimeoutError) as exc:
                log.error("restart_failed", endpoint=self.config.endpoint_name,
                          error=f"{type(exc).__name__}: {exc}"[:500])
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def node_of_peeker(self) -> str:
        """The Ray node id the peeker runs on."""
        node: str = await self.peeker.node_id.remote()
        return node

    async def stop(self) -> DeploymentStatus:
        """Graceful stop (receivers finish in-flight work within ``stop_timeout``)."""
        import ray

        self.stopped = True
        final: DeploymentStatus = await self.peeker.stop.remote()
        ray.kill(self.peeker, no_restart=True)
        log.info("endpoint_stopped", endpoint=self.config.endpoint_name,
                 processed=final.processed)
        return final


async def deployment_config(
    endpoint: str | Endpoint,
    settings: EndpointSettings | None = None,
    *,
    prepared: bool = False,
    before_budget: Callable[[EndpointSettings], Awaitable[None]] | None = None,
    **overrides: Any,
) -> DeploymentConfig:
    """What a new deployment of ``endpoint`` runs with, its database ready: the settings
    (overrides applied, validated), the connection budget checked, the queues and tables
    created (unless ``prepared``), a fresh deployment id. ``before_budget``: a check of the
    settings that comes first (where Ray can place the actors)."""
    if isinstance(endpoint, str):
        path, endpoint = endpoint, load_endpoint(endpoint)
    else:
        path = endpoint.import_path
    settings = await deployment_settings(endpoint, settings, **overrides)
    if settings.tracing:
        from endpoint_runtime.chain import tracing

        tracing.check()  # here, not in each receiver as it starts
    if before_budget is not None:
        await before_budget(settings)
    # On the server itself, not through a pooler: its capacity and pg_stat_activity.
    async with (PostgresTransport.connect(settings.transport, direct=True) as transport,
                transport.pool.acquire() as connection):  # before anything is created
        await check_connection_budget(connection, settings, endpoint=endpoint.name)
    if not prepared:
        await prepare_endpoint(endpoint, settings)
    dsn = settings.transport.dsn
    assert dsn is not None  # resolved by deployment_settings
    return _reserving(DeploymentConfig(
        endpoint_path=path,
        endpoint_name=endpoint.name,
        address=endpoint.address,
        dsn=dsn,
        settings=settings,
        deployment_id=uuid.uuid4().hex[:8],
        otel_environment=OtelEnvironment.of(os.environ) if settings.tracing else {},
    ))


def _reserving(config: DeploymentConfig) -> DeploymentConfig:
    """``config`` whose DSN, the one the peeker and the receivers connect with, names the
    deployment's reservation as ``application_name`` (see
    :mod:`endpoint_runtime.connections.connection_budget`): deployments started later count what
    this one
    may open, not only what it has open."""
    tag = reservation(config.deployment_id, ConnectionBudget.of(config.settings).worst_case,
                      config.endpoint_name)
    transport = config.settings.transport
    if transport.pooler_dsn is not None:
        # Through a pooler too: the server sees the tag in each transaction the pooler runs
        # for these pools (operators tell the deployment's work apart in pg_stat_activity).
        transport = msgspec.structs.replace(
            transport, pooler_dsn=reserving_dsn(transport.pooler_dsn, tag))
        config = msgspec.structs.replace(
            config, settings=msgspec.structs.replace(config.settings, transport=transport))
    return msgspec.structs.replace(config, dsn=RedactedDsn(reserving_dsn(config.dsn, tag)))


async def _start_peeker(config: DeploymentConfig, resources: dict[str, float] | None,
                        generation: int = 0, timeout: float | None = None) -> Any:  # noqa: ASYNC109
    """Create the PeekerActor of ``config`` (on a node with ``resources``, when given) and
    wait until it has started its receivers, at most ``timeout`` seconds (then
    ``TimeoutError``). ``generation``: the peekers created for this deployment before it (a
    recreated peeker keeps the deployment id, and the name of a lost one may linger). A peeker
    that did not start, for whatever reason (a timeout, a cancelled restart), is killed: one
    still waiting for its node would otherwise start later beside its successor."""
    import ray

    placement: dict[str, Any] = {"resources": dict(resources)} if resources else {}
    name = f"peeker-{config.endpoint_name}-{config.deployment_id}"
    peeker = PeekerActor.options(
        num_cpus=0, max_restarts=0, name=f"{name}-{generation}" if generation else name,
        **placement,
    ).remote(config)
    try:
        await asyncio.wait_for(peeker.start.remote(), timeout)  # type: ignore[attr-defined]
    except BaseException:
        with contextlib.suppress(Exception):
            ray.kill(peeker, no_restart=True)  # type: ignore[arg-type]
        raise
    return peeker


def _some_live_node_has(resources: dict[str, float]) -> bool:
    return bool(live_nodes(resources))


def check_placement(settings: EndpointSettings,
                    peeker_resources: dict[str, float] | None) -> None:
    """Raise :class:`ResourcesUnavailableError`, naming the resources, when the receivers'
    ``receiver_resources`` or the peeker's resources fit no live node and no node type of
    the autoscaler's configuration (read on the head, where ``ray up`` writes it)."""
    import ray

    nodes = [node["Resources"] for node in ray.nodes()  # type: ignore[no-untyped-call]
             if node.get("Alive")]
    node_types = autoscaler_node_types()
    for what, request in (("receiver_resources", settings.receiver_resources),
                          ("peeker_resources", peeker_resources or {})):
        problem = scaling.unsatisfiable(request, nodes, node_types)
        if problem is not None:
            raise ResourcesUnavailableError(f"{what} {json.dumps(request)}: {problem}")


async def deployment_settings(endpoint: Endpoint, settings: EndpointSettings | None = None,
                              **overrides: Any) -> EndpointSettings:
    """The settings a deployment of ``endpoint`` runs with: ``settings`` (default: the
    endpoint's) with ``overrides`` applied, validated, the DSN resolved (an embedded server
    started when none is configured) and wrapped so that its repr hides the password."""
    endpoint.validate()
    settings = settings or endpoint.settings
    if overrides:
        settings = replace_settings(settings, **overrides)
    transport_settings = settings.transport
    if transport_settings.schema != endpoint.address.schema:
        # The queue, the delayed-message store and the outbox of an endpoint are placed
        # when it is created; moving only some of them would split the endpoint.
        raise ConfigurationError(
            f"endpoint {endpoint.name!r} lives in schema {endpoint.address.schema!r}; "
            f"a deployment cannot move it to {transport_settings.schema!r} (set the "
            "schema in the Endpoint's own settings instead)"
        )
    # Its repr hides the password: the DSN travels in configs, to Ray actors, into reprs.
    dsn = RedactedDsn(await asyncio.to_thread(resolve_dsn, transport_settings.dsn))
    transport_settings = msgspec.structs.replace(transport_settings, dsn=dsn)
    return msgspec.structs.replace(settings, transport=transport_settings)


async def missing_route_queues(transport: PostgresTransport, endpoint: Endpoint) -> list[str]:
    """The queues ``endpoint``'s routes name whose tables do not exist."""
    schema = endpoint.address.schema
    missing = []
    async with transport.pool.acquire() as connection:
        for queue in endpoint.routes.destinations():
            qualified = QueueAddress.parse(queue, schema).qualified
            if await connection.fetchval("SELECT to_regclass($1) IS NULL", qualified):
                missing.append(queue)
    return missing


async def prepare_endpoint(endpoint: Endpoint, settings: EndpointSettings, *,
                           install: bool = False) -> None:
    """What a deployment needs in the database before its peeker starts: its queues and
    tables (created with installers, or ``install``, as ``endpoint-runtime db install``
    does; else checked), and, with ``auto_subscribe``, its subscriptions. Run it for every
    endpoint before any starts, and the publishers among them find their subscribers. A route
    to a queue that does not exist yet is logged (``routes_to_missing_queues``): its owner
    may not be deployed yet, and a send to it fails until it is."""
    async with PostgresTransport.connect(settings.transport) as transport:
        if install:
            await installation.install(transport, endpoint, settings)
        else:
            await installation.prepare(transport, endpoint, settings)
        missing = await missing_route_queues(transport, endpoint)
        if missing:
            log.warning("routes_to_missing_queues", endpoint=endpoint.name,
                        routes={name: queue for name, queue in endpoint.routes.items()
                                if queue in missing},
                        hint="deploy the endpoints that own these queues, or create them "
                             "(endpoint-runtime queues create NAME)")
        if settings.auto_subscribe:  # events only; stored command subscriptions pruned
            async with transport.pool.acquire() as connection:
                await endpoint.subscribe_at_start(connection,
                                                  subscription_store(settings.transport))
