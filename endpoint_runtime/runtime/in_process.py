"""An endpoint in process: its peeker and receivers as plain objects on the caller's event loop.

The same :class:`~endpoint_runtime.runtime.actors.peeker.Peeker` and
:class:`~endpoint_runtime.runtime.actors.receiver.Receiver` as a deployment on Ray, with the
same queues, tables, chain, strategies, delayed-message mover and settings, against the same
PostgreSQL; only the process boundary is gone. Starting one takes milliseconds instead of the
seconds two Ray worker processes take, which is what integration tests of one's own endpoints
want::

    deployment = await InProcessDeployment.start(endpoint, transport=TransportSettings(dsn=dsn))
    ...  # send, then wait for what the handlers write
    await deployment.stop()

What needs separate processes is not here: a receiver cannot die alone (its process is the
caller's), so the crash ledger never counts a death; receivers share one event loop, one
garbage collector (untuned: see :mod:`endpoint_runtime.runtime.collector`) and one node;
``peeker_resources`` and ``receiver_resources`` are not placed. Ray's metrics export needs Ray
running in the process to leave it; ``tracing=True`` is refused (the tracer provider is one per
process: the host's). Deploy with :class:`EndpointDeployment` for all of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import structlog

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.runtime.actors.crash_ledger import read_ledger
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig, DeploymentStatus
from endpoint_runtime.runtime.actors.peeker import Peeker
from endpoint_runtime.runtime.actors.receiver import LOCAL_NODE, Receiver
from endpoint_runtime.runtime.actors.receiver_handles import ReceiverHandle, receiver_config
from endpoint_runtime.runtime.deployment import deployment_config
from endpoint_runtime.runtime.endpoint import Endpoint
from endpoint_runtime.settings import EndpointSettings

T = TypeVar("T")

log = structlog.get_logger("endpoint_runtime.in_process")



async def _in_process_settings(settings: EndpointSettings) -> None:
    """What an endpoint in process cannot do: tracing installs and, at its stop, shuts down
    the process's one OpenTelemetry tracer provider, which is the host's."""
    if settings.tracing:
        raise ConfigurationError(
            "tracing=True needs processes of the endpoint's own (OpenTelemetry's tracer "
            "provider is one per process): deploy on Ray (EndpointDeployment), or turn "
            "tracing off for the deployment in process (tracing=False)")


class ReceiverLostError(Exception):
    """What a call to a lost receiver raises; an in-process receiver cannot be lost alone."""


class InProcessReceivers:
    """Receivers as :class:`Receiver` objects on the peeker's event loop."""

    lost: tuple[type[BaseException], ...] = (ReceiverLostError,)
    own_process = False

    def __init__(self) -> None:
        self._launched: list[Receiver] = []
        """Every receiver launched: one whose start was cut short (a cancelled cycle) is in
        no list of the peeker's, and :meth:`ended` still closes it."""
        self._closing: dict[str, asyncio.Task[None]] = {}
        """The closes under way, by receiver id."""

    def launch(self, deployment: DeploymentConfig, settings: EndpointSettings,
               node_id: str | None) -> ReceiverHandle:
        config = receiver_config(deployment, settings)
        receiver = Receiver(config, own_process=self.own_process)
        self._launched = [r for r in self._launched if not r.drained]
        self._launched.append(receiver)
        return ReceiverHandle(receiver_id=config.receiver_id, actor=receiver, node_id=LOCAL_NODE)

    async def call(self, handle: ReceiverHandle, method: str, *args: Any) -> Any:
        result = getattr(handle.actor, method)(*args)
        return await result if inspect.isawaitable(result) else result

    def kill(self, handle: ReceiverHandle) -> None:
        """A receiver that did not drain (its start failed) closes what it opened."""
        self._close(handle.actor)

    def _close(self, receiver: Receiver) -> None:
        receiver_id = receiver.config.receiver_id
        if not receiver.drained and receiver_id not in self._closing:
            task = asyncio.get_running_loop().create_task(_closed(receiver))
            self._closing[receiver_id] = task
            task.add_done_callback(lambda _: self._closing.pop(receiver_id, None))

    def live_nodes(self, resources: Mapping[str, float] | None) -> list[str]:
        return [LOCAL_NODE]

    def node_alive(self, node_id: str) -> bool:
        return node_id == LOCAL_NODE

    async def read_ledger(self, node_id: str, path: str) -> list[uuid.UUID]:
        return read_ledger(path)

    def this_node(self) -> str:
        return LOCAL_NODE

    async def ended(self) -> None:
        """Close every receiver not drained yet and wait until all are closed."""
        for receiver in self._launched:
            self._close(receiver)
        await asyncio.gather(*self._closing.values())
        self._launched = [r for r in self._launched if not r.drained]


async def _closed(receiver: Receiver) -> None:
    """Drain ``receiver`` at once; a receiver whose start failed early (no chain yet) still
    closes what it opened, and the failure is logged rather than left in a task."""
    try:
        await receiver.drain(0.0)
    except Exception as exc:
        log.warning("receiver_close_failed", receiver=receiver.config.receiver_id,
                    error=f"{type(exc).__name__}: {exc}"[:500])


class InProcessDeployment:
    """A running endpoint whose peeker and receivers live on this event loop; the methods of
    :class:`~endpoint_runtime.runtime.deployment.EndpointDeployment` that do not need Ray."""

    def __init__(self, config: DeploymentConfig, peeker: Peeker, receivers: InProcessReceivers,
                 context: contextvars.Context) -> None:
        self.config = config
        self.peeker = peeker
        self._receivers = receivers
        self._context = context
        self.stopped = False

    @classmethod
    async def start(cls, endpoint: str | Endpoint, *, settings: EndpointSettings | None = None,
                    prepared: bool = False, **overrides: Any) -> InProcessDeployment:
        """Create the endpoint's queues and tables, as :meth:`EndpointDeployment.start` does,
        then start its peeker here, which starts its receivers here. ``endpoint``: an Endpoint
        or its ``module:attribute`` path; ``overrides``: settings for this deployment."""
        config = await deployment_config(endpoint, settings, prepared=prepared,
                                         before_budget=_in_process_settings, **overrides)
        receivers = InProcessReceivers()
        # A context of its own: the peeker and receivers bind log fields, not in the caller's.
        context = contextvars.copy_context()
        peeker = context.run(Peeker, config, receivers)
        deployment = cls(config, peeker, receivers, context)
        try:
            await deployment._run(peeker.start())
        except BaseException:
            try:
                with contextlib.suppress(Exception):  # the start's own error is the one to see
                    await deployment._run(peeker.stop())
            finally:
                await receivers.ended()
            raise
        return deployment

    async def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.get_running_loop().create_task(work, context=self._context)

    async def status(self, refresh: bool = False) -> DeploymentStatus:
        """As :meth:`EndpointDeployment.status`."""
        return await self._run(self.peeker.status(refresh))

    async def set_max_concurrency(self, max_concurrency: int) -> None:
        await self._run(self.peeker.set_max_concurrency(max_concurrency))

    async def receiver_pids(self) -> list[int]:
        """This process's id once per receiver (refreshing the peeker's view of each)."""
        return await self._run(self.peeker.receiver_pids())

    async def node_of_peeker(self) -> str:
        return LOCAL_NODE

    async def stop(self) -> DeploymentStatus:
        """Graceful stop (receivers finish in-flight work within ``stop_timeout``)."""
        self.stopped = True
        final = await self._run(self.peeker.stop())
        await self._receivers.ended()
        return final
