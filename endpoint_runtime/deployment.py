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
import uuid
from typing import Any

import msgspec
import structlog

from endpoint_runtime.actors.cluster import ensure_ray
from endpoint_runtime.actors.peeker import DeploymentConfig, DeploymentStatus, PeekerActor
from endpoint_runtime.connection_budget import check_connection_budget
from endpoint_runtime.embedded import RedactedDsn, resolve_dsn
from endpoint_runtime.endpoint import Endpoint, load_endpoint, outbox_storage
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.settings import replace as replace_settings
from endpoint_runtime.subscriptions import subscribe_to_handled_types, subscription_store
from endpoint_runtime.transport import PostgresTransport, QueueAddress

log = structlog.get_logger("endpoint_runtime.deployment")


class EndpointDeployment:
    """A running endpoint: one PeekerActor and the ReceiverActors it manages."""

    def __init__(self, config: DeploymentConfig, peeker: Any) -> None:
        self.config = config
        self.peeker = peeker

    @classmethod
    async def start(
        cls,
        endpoint: str | Endpoint,
        *,
        settings: EndpointSettings | None = None,
        **overrides: Any,
    ) -> EndpointDeployment:
        """Create the endpoint's queues, then start its peeker (which starts receivers).

        ``endpoint`` is an Endpoint defined at module level, or its ``module:attribute`` path.
        Setting overrides (e.g. ``max_concurrency=4``) apply to this deployment only.
        """
        if isinstance(endpoint, str):
            path, endpoint = endpoint, load_endpoint(endpoint)
        else:
            path = endpoint.import_path
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
        settings = msgspec.structs.replace(settings, transport=transport_settings)
        async with PostgresTransport.connect(transport_settings) as transport:
            async with transport.pool.acquire() as connection:  # before anything is created
                await check_connection_budget(connection, settings, endpoint=endpoint.name)
            await transport.create_queue(endpoint.address)
            await transport.create_queue(
                QueueAddress.parse(settings.error_queue, transport_settings.schema)
            )
            async with transport.pool.acquire() as connection:
                if endpoint.delayed_store is not None and settings.delayed_delivery.enabled:
                    await endpoint.delayed_store.setup_infrastructure(connection)
                if settings.outbox is not None:
                    await outbox_storage(endpoint.address, settings).setup(connection)
                if settings.auto_subscribe:
                    await subscribe_to_handled_types(
                        connection, subscription_store(transport_settings), endpoint.name,
                        endpoint.address, endpoint.registry.handled_types)
            if settings.audit_queue:
                await transport.create_queue(
                    QueueAddress.parse(settings.audit_queue, transport_settings.schema))
        config = DeploymentConfig(
            endpoint_path=path,
            endpoint_name=endpoint.name,
            address=endpoint.address,
            dsn=dsn,
            settings=settings,
            deployment_id=uuid.uuid4().hex[:8],
        )
        ensure_ray()  # in this thread: Ray installs its signal handlers in the main thread
        peeker = PeekerActor.options(
            num_cpus=0, max_restarts=0, name=f"peeker-{endpoint.name}-{config.deployment_id}"
        ).remote(config)
        await peeker.start.remote()  # type: ignore[attr-defined]
        log.info("endpoint_started", endpoint=endpoint.name, path=path,
                 mode=settings.mode.value, max_concurrency=settings.max_concurrency)
        return cls(config, peeker)

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

    async def stop(self) -> DeploymentStatus:
        """Graceful stop (receivers finish in-flight work within ``stop_timeout``)."""
        import ray

        final: DeploymentStatus = await self.peeker.stop.remote()
        ray.kill(self.peeker, no_restart=True)
        log.info("endpoint_stopped", endpoint=self.config.endpoint_name,
                 processed=final.processed)
        return final
