"""A deployment's work beside its receivers, run by the peeker: the delayed-message mover,
the outbox cleaner, and the endpoint's own periodic tasks (``Endpoint.background_tasks``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import asyncpg

from endpoint_runtime.chain.outbox.storage import OutboxCleaner, OutboxStorage
from endpoint_runtime.connections.circuit_breakers import CircuitBreaker
from endpoint_runtime.delayed.mover import DelayedMessageMover
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig
from endpoint_runtime.runtime.endpoint import load_endpoint
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.listening import Listener

CriticalErrorHook = Callable[[str, BaseException], None]


class BackgroundWork:
    """Started once with the peeker, stopped before its receivers drain."""

    def __init__(self) -> None:
        self.mover: DelayedMessageMover | None = None
        self._mover_task: asyncio.Task[None] | None = None
        self._cleaner: OutboxCleaner | None = None
        self._cleaner_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def breakers(self) -> list[CircuitBreaker]:
        """The mover's circuit breakers (none without a mover)."""
        if self.mover is None:
            return []
        return [self.mover.fetch_breaker, self.mover.dispatch_breaker]

    async def start(
        self, config: DeploymentConfig, settings: EndpointSettings, pool: asyncpg.Pool,
        listener: Listener, on_critical_error: CriticalErrorHook,
        on_disarmed: Callable[[], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        endpoint = load_endpoint(config.endpoint_path)
        outbox = settings.outbox
        if outbox is not None and outbox.cleanup_enabled:
            self._cleaner = OutboxCleaner(
                OutboxStorage.for_settings(config.address, settings), pool, outbox,
                on_critical_error,
            )
            self._cleaner_task = loop.create_task(self._cleaner.run())
        self._tasks = [loop.create_task(work) for work in endpoint.background_tasks(pool, settings)]
        store = endpoint.delayed_store
        if store is None or not settings.delayed_delivery.enabled:
            return
        on_dispatched = None
        if settings.tracing:  # imported only when on: a span per dispatch of a due message
            from endpoint_runtime.chain.tracing.delivery import DeliverySpans

            on_dispatched = DeliverySpans(config.endpoint_name)
        self.mover = DelayedMessageMover(
            store=store,
            pool=pool,
            dsn=config.dsn,
            endpoint=config.endpoint_name,
            schema=config.address.schema,
            error_address=QueueAddress.parse(settings.error_queue, config.address.schema),
            settings=settings.delayed_delivery,
            on_critical_error=on_critical_error,
            listener=listener,
            on_dispatched=on_dispatched,
        )
        for breaker in self.breakers:
            breaker.on_disarmed = on_disarmed
        self._mover_task = loop.create_task(self.mover.run())

    async def stop(self) -> None:
        if self._cleaner is not None and self._cleaner_task is not None:
            self._cleaner.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cleaner_task
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.mover is not None and self._mover_task is not None:
            await self.mover.stop()
            self._mover_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._mover_task
