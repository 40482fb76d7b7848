"""PeekerActor: watches one endpoint's queue and keeps the right receivers running.

Loop: peek (max-min estimate over unlocked rows) -> check receivers (replace dead ones,
counting a death for each message they were handling: :mod:`.crash_ledger`) ->
scale to the policy of :mod:`endpoint_runtime.actors.scaling` -> wake idle receivers when
messages wait -> sleep until the peek delay passes or a NOTIFY arrives. Allowance decreases are
confirmed before increases are handed out, so at most ``max_concurrency`` messages are in
flight across the deployment at any moment.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from typing import Any

import asyncpg
import msgspec
import ray
import structlog
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from endpoint_runtime.actors import scaling
from endpoint_runtime.actors.crash_ledger import (
    MAX_RECEIVER_DEATHS,
    DeathCounts,
    ledger_path,
    read_ledger_on_node,
)
from endpoint_runtime.actors.receiver import ReceiverActor, ReceiverConfig, ReceiverStatus
from endpoint_runtime.circuit_breakers import BreakerState, CircuitBreaker
from endpoint_runtime.connecting import connect_pool
from endpoint_runtime.connection_budget import PEEKER_POOL_SIZE
from endpoint_runtime.delayed.mover import DelayedMessageMover
from endpoint_runtime.endpoint import load_endpoint
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.metrics import RayMetrics
from endpoint_runtime.outbox import OutboxCleaner, OutboxStorage
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transport import QueueAddress, receiving
from endpoint_runtime.transport.listening import Listener

log = structlog.get_logger("endpoint_runtime.peeker")

MIN_CYCLE_SECONDS = 0.1
STATUS_TIMEOUT_SECONDS = 10.0
LEDGER_READ_TIMEOUT_SECONDS = 30.0


class DeploymentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Plain, picklable description of one endpoint deployment."""

    endpoint_path: str
    endpoint_name: str
    address: QueueAddress
    dsn: str
    settings: EndpointSettings
    deployment_id: str


class DeploymentStatus(msgspec.Struct, frozen=True, kw_only=True):
    endpoint: str
    estimate: int
    max_concurrency: int
    receivers: list[ReceiverStatus]
    replaced_receivers: int
    delayed_dispatched: int = 0
    delayed_to_error: int = 0
    critical_error: str | None = None
    """The critical error in effect: with ``on_critical_error="log"`` it is cleared once every
    circuit breaker has disarmed again (the database is back, work goes on by itself); with
    ``"stop"`` it stays, with ``halted``."""
    halted: bool = False
    """A critical error stopped receiving (``on_critical_error="stop"``): no receivers run
    until the deployment is started again. The peek estimate still follows the queue."""
    last_critical_error: str | None = None
    """The latest critical error, even when it is over."""
    doomed_messages: int = 0
    """Messages that were in the handlers of :data:`MAX_RECEIVER_DEATHS` receivers when they
    died, waiting for their next delivery to go to the error queue (crash ledger)."""
    retired_processed: int = 0
    """Messages processed by receivers that were retired or died (their last status)."""
    retired_failed: int = 0
    retired_by_node: dict[str, int] = {}
    """Messages processed by retired or dead receivers, per Ray node id."""

    @property
    def receivers_by_node(self) -> dict[str, int]:
        """Receivers running on each Ray node (node id: count)."""
        return dict(collections.Counter(r.node_id for r in self.receivers))

    @property
    def processed_by_node(self) -> dict[str, int]:
        """Messages processed on each Ray node, by running and retired receivers alike."""
        counts = collections.Counter(self.retired_by_node)
        for receiver in self.receivers:
            counts[receiver.node_id] += receiver.processed
        return dict(counts)

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.receivers)

    @property
    def processed(self) -> int:
        return self.retired_processed + sum(r.processed for r in self.receivers)

    @property
    def outbox_duplicates(self) -> int:
        return sum(r.outbox_duplicates for r in self.receivers)

    @property
    def failed(self) -> int:
        return self.retired_failed + sum(r.failed for r in self.receivers)


class _Handle(msgspec.Struct, kw_only=True):
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


class Peeker:
    """Plain class; :data:`PeekerActor` is its Ray actor form."""

    def __init__(self, config: DeploymentConfig) -> None:
        configure_logging()
        structlog.contextvars.bind_contextvars(endpoint=config.endpoint_name)
        self.config = config
        self.settings = config.settings
        self._receivers: list[_Handle] = []
        self._estimate = 0
        self._metrics = RayMetrics(config.endpoint_name)
        self._idle_since = time.monotonic()
        self._wake = asyncio.Event()
        self._stopping = False
        self._replaced = 0
        self._lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None
        self._pool: asyncpg.Pool | None = None
        self._listener: Listener | None = None
        self._mover: DelayedMessageMover | None = None
        self._mover_task: asyncio.Task[None] | None = None
        self._cleaner: OutboxCleaner | None = None
        self._cleaner_task: asyncio.Task[None] | None = None
        self._background: list[asyncio.Task[None]] = []
        """The endpoint's own periodic work (``Endpoint.background_tasks``)."""
        self.critical_error: str | None = None
        self.last_critical_error: str | None = None
        self._halted = False
        self._deaths = DeathCounts()
        # Peeks fail when the database is away even while no receiver tries to receive: as
        # the original's peek circuit breaker, this one raises the critical error then.
        self._peek_breaker = CircuitBreaker(
            "peek",
            time_to_trigger=self.settings.circuit_breaker_time_to_trigger,
            on_triggered=self.on_critical_error,
            armed_delay=self.settings.circuit_breaker_armed_delay,
            triggered_delay=self.settings.circuit_breaker_triggered_delay,
            on_disarmed=self._critical_error_maybe_over,
        )
        self._retired_processed = 0
        self._retired_failed = 0
        self._retired_by_node: collections.Counter[str] = collections.Counter()

    def _count_retired(self, last: ReceiverStatus | None) -> None:
        if last is not None:
            self._retired_processed += last.processed
            self._retired_failed += last.failed
            self._retired_by_node[last.node_id] += last.processed

    def on_critical_error(self, message: str, exc: BaseException) -> None:
        """Default critical-error action: log it and, unless configured to only log, stop
        receiving (receivers drain; the deployment reports the error in its status)."""
        self.critical_error = self.last_critical_error = message
        log.critical("critical_error", error=message)
        if self.settings.on_critical_error == "stop" and not self._stopping and not self._halted:
            self._halted = True  # from now on no cycle scales up again
            log.error("receiving_halted", reason=message)
            asyncio.get_running_loop().create_task(self._stop_receiving())

    async def _stop_receiving(self) -> None:
        async with self._lock:
            self.settings = msgspec.structs.replace(self.settings, min_receivers=0)
            while self._receivers:
                await self._retire(self._receivers.pop())

    def _critical_error_maybe_over(self) -> None:
        """With "log", the critical error is over when every breaker of the deployment (the
        peek breaker, the mover's, each receiver's) has disarmed again."""
        if self.critical_error is None or self._halted:
            return
        breakers = [self._peek_breaker]
        if self._mover is not None:
            breakers += [self._mover.fetch_breaker, self._mover.dispatch_breaker]
        if any(b.state is not BreakerState.DISARMED for b in breakers):
            return
        if any(h.last is None or h.last.critical_error for h in self._receivers):
            return
        log.info("critical_error_over", error=self.critical_error)
        self.critical_error = None

    async def start(self) -> None:
        self._pool = await connect_pool(self.config.dsn, min_size=1, max_size=PEEKER_POOL_SIZE)
        # One LISTEN connection for the peeker and the mover: PostgreSQL signals every
        # listening backend on each NOTIFY in the database, so fewer listeners cost less.
        self._listener = Listener(self.config.dsn)
        await self._listener.start()
        if self.settings.transport.notify_on_send:
            await self._listener.listen(self.config.address.notify_channel, self._wake.set)
        await self._start_mover()
        async with self._lock:
            await self._reconcile()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())
        log.info("peeker_started", max_concurrency=self.settings.max_concurrency)

    async def _run(self) -> None:
        peek_delay = self.settings.transport.peek_delay
        while not self._stopping:
            started = time.monotonic()
            self._wake.clear()  # before the cycle: a NOTIFY during it wakes the next one
            try:
                async with self._lock:
                    await self._reconcile()
            except Exception as exc:
                log.warning("peek_cycle_failed", error=f"{type(exc).__name__}: {exc}")
                await self._peek_breaker.failure(exc)
            else:
                self._peek_breaker.success()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=peek_delay)
            elapsed = time.monotonic() - started
            if elapsed < MIN_CYCLE_SECONDS:
                await asyncio.sleep(MIN_CYCLE_SECONDS - elapsed)

    async def _start_mover(self) -> None:
        endpoint = load_endpoint(self.config.endpoint_path)
        assert self._pool is not None
        outbox = self.settings.outbox
        if outbox is not None and outbox.cleanup_enabled:
            self._cleaner = OutboxCleaner(
                OutboxStorage.for_settings(self.config.address, self.settings), self._pool, outbox,
                self.on_critical_error,
            )
            self._cleaner_task = asyncio.get_running_loop().create_task(self._cleaner.run())
        self._background = [asyncio.get_running_loop().create_task(work) for work in
                            endpoint.background_tasks(self._pool, self.settings)]
        store = endpoint.delayed_store
        if store is None or not self.settings.delayed_delivery.enabled:
            return
        assert self._pool is not None
        self._mover = DelayedMessageMover(
            store=store,
            pool=self._pool,
            dsn=self.config.dsn,
            endpoint=self.config.endpoint_name,
            schema=self.config.address.schema,
            error_address=QueueAddress.parse(
                self.settings.error_queue, self.config.address.schema
            ),
            settings=self.settings.delayed_delivery,
            on_critical_error=self.on_critical_error,
            listener=self._listener,
        )
        for breaker in (self._mover.fetch_breaker, self._mover.dispatch_breaker):
            breaker.on_disarmed = self._critical_error_maybe_over
        self._mover_task = asyncio.get_running_loop().create_task(self._mover.run())

    async def _reconcile(self) -> None:
        assert self._pool is not None
        cap = self.settings.transport.max_records_to_peek
        self._estimate = await receiving.peek(self._pool, self.config.address, cap)
        self._metrics.queue_length(self._estimate)
        if self._halted:
            return  # the estimate stays current; nothing is started
        await self._refresh_statuses()
        busy = sum(h.last.in_flight for h in self._receivers if h.last)
        now = time.monotonic()
        if self._estimate > 0 or busy > 0:
            self._idle_since = now
        wanted = scaling.receivers_needed(scaling.ScalingInput(
            estimate=self._estimate,
            busy_slots=busy,
            current_receivers=len(self._receivers),
            idle_seconds=now - self._idle_since,
            max_concurrency=self.settings.max_concurrency,
            slots_per_receiver=self.settings.slots_per_receiver,
            min_receivers=self.settings.min_receivers,
            scale_down_after=self.settings.scale_down_after,
        ))
        await self._scale_to(wanted)
        if self._estimate > 0:
            await self._wake_idle()

    async def _refresh_statuses(self, hand_over: bool = True) -> None:
        """Ask every receiver for its status (handing over the crash ledger's doomed ids when
        they changed); replace the ones that died, counting a death for each message they
        were handling, and hand the result to the others at once."""
        if not self._receivers:
            return
        version = self._deaths.version
        doomed = (self._deaths.snapshot()
                  if any(h.doomed_version < version for h in self._receivers) else None)
        results = await asyncio.gather(
            *(asyncio.wait_for(
                _ref(h.actor.status.remote(doomed if h.doomed_version < version else None)),
                STATUS_TIMEOUT_SECONDS)
              for h in self._receivers),
            return_exceptions=True,
        )
        for handle, result in zip(list(self._receivers), results, strict=True):
            if isinstance(result, ReceiverStatus):
                handle.last = result
                handle.doomed_version = version
                if result.settled_doomed:
                    self._deaths.settle(result.settled_doomed)
                if result.critical_errors > handle.critical_errors_seen:
                    # Each new one, even if it is over already (a short outage).
                    handle.critical_errors_seen = result.critical_errors
                    error = result.last_critical_error or "critical error"
                    self.on_critical_error(error, RuntimeError(error))
            elif isinstance(result, ray.exceptions.RayActorError):
                log.warning("receiver_died", receiver=handle.receiver_id,
                            error=_last_line(result))
                self._receivers.remove(handle)
                self._count_retired(handle.last)
                self._replaced += 1
                await self._count_deaths(handle, _last_line(result))
            else:
                log.warning("receiver_status_failed", receiver=handle.receiver_id,
                            error=repr(result)[:200])
        self._critical_error_maybe_over()
        if hand_over and any(h.doomed_version < self._deaths.version for h in self._receivers):
            await self._refresh_statuses(hand_over=False)

    async def _count_deaths(self, handle: _Handle, error: str) -> None:
        """A receiver died: count a death for each message its handlers were running (its
        crash ledger, read on its node)."""
        node_id = handle.node_id or (handle.last.node_id if handle.last else None)
        if node_id is None:
            return  # it died before it could take anything
        if not await asyncio.to_thread(_node_alive, node_id):
            # The whole node went down (a machine lost, its raylet killed): the receiver's
            # connections closed with it and its messages rolled back. Not the messages' fault.
            log.warning("receiver_node_lost", receiver=handle.receiver_id, node=node_id[:12])
            return
        path = handle.ledger or str(ledger_path(handle.receiver_id))
        try:
            native_ids = await asyncio.wait_for(read_ledger_on_node(node_id, path),
                                                LEDGER_READ_TIMEOUT_SECONDS)
        except Exception as exc:  # the node went with it: nothing to count
            log.warning("crash_ledger_unreadable", receiver=handle.receiver_id,
                        error=f"{type(exc).__name__}: {exc}"[:500])
            return
        pid = handle.last.pid if handle.last else "?"
        where = f"receiver {handle.receiver_id} (pid {pid}, node {node_id[:12]}): {error}"
        for native_id in native_ids:
            deaths = self._deaths.count(native_id, where)
            log.error("receiver_died_handling_message", native_id=str(native_id),
                      receiver=handle.receiver_id, deaths=deaths,
                      to_error_queue=deaths >= MAX_RECEIVER_DEATHS)

    async def _scale_to(self, wanted: int) -> None:
        while len(self._receivers) > wanted:
            handle = self._receivers.pop()
            await self._retire(handle)
        new: list[_Handle] = []
        missing = wanted - len(self._receivers)
        if missing > 0:
            nodes: list[str | None] = [None] * missing
            if not self.settings.receiver_resources:
                nodes = list(scaling.spread_over_nodes(
                    await asyncio.to_thread(_live_nodes), [h.node_id for h in self._receivers],
                    missing))
                nodes += [None] * (missing - len(nodes))
            new = [self._launch(node) for node in nodes]
        if new:
            version, doomed = self._deaths.version, self._deaths.snapshot() or None
            started = await asyncio.gather(
                *(_ref(h.actor.start.remote(doomed)) for h in new), return_exceptions=True
            )
            for handle, result in zip(new, started, strict=True):
                if isinstance(result, BaseException):
                    log.error("receiver_start_failed", error=_last_line(result),
                              cause=repr(getattr(result, "cause", None))[:2000])
                    ray.kill(handle.actor, no_restart=True)
                else:
                    handle.node_id, handle.ledger = result["node_id"], result["ledger"]
                    handle.doomed_version = version
                    self._receivers.append(handle)
        await self._apply_allowances()

    def _launch(self, node_id: str | None) -> _Handle:
        receiver_id = f"{self.config.endpoint_name}-{uuid.uuid4().hex[:8]}"
        config = ReceiverConfig(
            endpoint_path=self.config.endpoint_path,
            dsn=self.config.dsn,
            settings=self.settings,
            receiver_id=receiver_id,
        )
        # Placement: pinned to the nodes that have the custom resources asked for, or spread
        # over the live nodes (``node_id``: the one with the fewest receivers). Hard affinity:
        # Ray's soft affinity moved receivers to other nodes now and then; if the node is
        # gone, the start fails and the next cycle places the receiver on a live node. Never
        # restarted by Ray: the peeker replaces dead receivers itself.
        placement: dict[str, Any] = {"scheduling_strategy": "SPREAD"}
        if self.settings.receiver_resources:
            placement = {"resources": dict(self.settings.receiver_resources)}
        elif node_id is not None:
            placement = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        actor = ReceiverActor.options(
            num_cpus=self.settings.receiver_num_cpus, max_restarts=0, **placement,
        ).remote(config)
        log.info("receiver_launched", receiver=receiver_id, node=(node_id or "?")[:12])
        return _Handle(receiver_id=receiver_id, actor=actor, node_id=node_id)

    async def _apply_allowances(self) -> None:
        targets = scaling.allowances(
            len(self._receivers), self.settings.max_concurrency, self.settings.slots_per_receiver
        )
        throttled = [i for i, h in enumerate(self._receivers) if h.last and h.last.throttled]
        if throttled:
            # Outage throttling holds the whole deployment to one message at a time: the
            # first throttled receiver (itself down to one slot) is the only one that runs.
            targets = [t if i == throttled[0] else 0 for i, t in enumerate(targets)]
        pairs = list(zip(self._receivers, targets, strict=True))
        # Decreases first, and wait for them: only then may others grow.
        await asyncio.gather(*(self._set_allowance(h, t) for h, t in pairs if t < h.allowance))
        await asyncio.gather(*(self._set_allowance(h, t) for h, t in pairs if t > h.allowance))

    async def _set_allowance(self, handle: _Handle, allowance: int) -> None:
        await _ref(handle.actor.set_allowance.remote(allowance))
        handle.allowance = allowance

    async def _wake_idle(self) -> None:
        share = max(1, -(-self._estimate // max(1, len(self._receivers))))
        await asyncio.gather(
            *(_ref(h.actor.wake.remote(share)) for h in self._receivers
              if h.allowance > 0 and (h.last is None or h.last.slots < h.allowance)),
            return_exceptions=True,
        )

    async def _retire(self, handle: _Handle) -> None:
        final = handle.last
        try:
            final = await _ref(handle.actor.drain.remote(self.settings.stop_timeout))
        except ray.exceptions.RayActorError as exc:
            await self._count_deaths(handle, _last_line(exc))
        self._count_retired(final)
        ray.kill(handle.actor, no_restart=True)
        log.info("receiver_retired", receiver=handle.receiver_id)

    # -- control (Ray calls) ----------------------------------------------------------------

    async def set_max_concurrency(self, max_concurrency: int) -> None:
        """Change the concurrency limit at runtime; takes effect before this returns."""
        async with self._lock:
            self.settings = msgspec.structs.replace(self.settings, max_concurrency=max_concurrency)
            self.settings.__post_init__()
            await self._reconcile()

    async def status(self, refresh: bool = False) -> DeploymentStatus:
        """The deployment's status; ``refresh`` asks every receiver now instead of reporting
        what they said at the last peek cycle."""
        if refresh:
            async with self._lock:
                await self._refresh_statuses()
        return self._status([h.last for h in self._receivers if h.last is not None])

    def _status(self, receivers: list[ReceiverStatus]) -> DeploymentStatus:
        return DeploymentStatus(
            endpoint=self.config.endpoint_name,
            estimate=self._estimate,
            max_concurrency=self.settings.max_concurrency,
            receivers=receivers,
            replaced_receivers=self._replaced,
            delayed_dispatched=self._mover.dispatched if self._mover else 0,
            delayed_to_error=self._mover.moved_to_error if self._mover else 0,
            critical_error=self.critical_error,
            halted=self._halted,
            last_critical_error=self.last_critical_error,
            doomed_messages=len(self._deaths.doomed),
            retired_processed=self._retired_processed,
            retired_failed=self._retired_failed,
            retired_by_node=dict(self._retired_by_node),
        )

    def node_id(self) -> str:
        """The Ray node this peeker runs on."""
        return str(ray.get_runtime_context().get_node_id())

    async def receiver_pids(self) -> list[int]:
        await self._refresh_statuses()
        return [h.last.pid for h in self._receivers if h.last is not None]

    async def stop(self) -> DeploymentStatus:
        """Graceful stop: receivers stop receiving, finish in-flight work, then exit."""
        self._stopping = True
        self._wake.set()
        if self._cleaner is not None and self._cleaner_task is not None:
            self._cleaner.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cleaner_task
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._mover is not None and self._mover_task is not None:
            await self._mover.stop()
            self._mover_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._mover_task
        async with self._lock:
            if self._loop_task is not None:
                self._loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop_task
            await self._refresh_statuses()
            final = await asyncio.gather(
                *(_ref(h.actor.drain.remote(self.settings.stop_timeout)) for h in self._receivers),
                return_exceptions=True,
            )
            for handle in self._receivers:
                ray.kill(handle.actor, no_restart=True)
            self._receivers.clear()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        if self._pool is not None:
            await self._pool.close()
        log.info("peeker_stopped")
        return self._status([s for s in final if isinstance(s, ReceiverStatus)])


def _live_nodes() -> list[str]:
    """Ids of the nodes Ray counts alive, in a stable order."""
    return sorted(node["NodeID"] for node in ray.nodes()  # type: ignore[no-untyped-call]
                  if node.get("Alive"))


def _node_alive(node_id: str) -> bool:
    """Whether Ray's control store still counts ``node_id`` among the live nodes."""
    return any(node.get("NodeID") == node_id and node.get("Alive")
               for node in ray.nodes())  # type: ignore[no-untyped-call]


def _last_line(error: BaseException) -> str:
    """Ray wraps errors in long tracebacks; the exception itself is at the end."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1][:1000] if lines else repr(error)


async def _ref(object_ref: Any) -> Any:
    """Await a Ray ObjectRef (kept in one place so timeouts wrap a coroutine)."""
    return await object_ref


PeekerActor = ray.remote(Peeker)
"""Ray actor form of :class:`Peeker`."""
