"""ReceiverActor: pulls messages from PostgreSQL itself and runs the handler pipeline.

A receiver runs up to ``allowance`` receive slots (asyncio tasks), each one message (or one
batch) in its own transaction. Slots follow the adaptive concurrency of the SQL Server
transport: a slot that finds the queue empty ends; a slot with a run of successful receives
starts another, up to the allowance. A wake-up (LISTEN/NOTIFY on its own connection, or a call
from the peeker) starts slots again. The allowance is set by the peeker; lowering it returns
only once the surplus slots have finished their current message.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import msgspec
import ray
import structlog

from endpoint_runtime.connections.circuit_breakers import BreakerState, CircuitBreaker
from endpoint_runtime.connections.connecting import close_pool, connect_pool
from endpoint_runtime.connections.connection_budget import receiver_pool_size
from endpoint_runtime.delayed.store import CircuitBreakingStore, DelayedMessageStore
from endpoint_runtime.errors import RecoverabilityFailedError
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.runtime.actors.committed_counts import ReceiverCounts, counts_table
from endpoint_runtime.runtime.actors.crash_ledger import CrashLedger, DoomedMessages
from endpoint_runtime.runtime.actors.ray_metrics import RayMetrics
from endpoint_runtime.runtime.collector import tune_receiver_process
from endpoint_runtime.runtime.endpoint import Endpoint, load_endpoint
from endpoint_runtime.settings import EndpointSettings
from endpoint_runtime.transactions.base import Round
from endpoint_runtime.transport.listening import Listener
from endpoint_runtime.transport.waiting import Waiting

log = structlog.get_logger("endpoint_runtime.receiver")

GROW_AFTER_SUCCESSES = 3
"""Consecutive successful receives after which a slot starts another slot."""


LOCAL_NODE = "local"
"""The node id of a receiver that runs outside Ray."""


class ReceiverConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a receiver needs: plain, picklable values only."""

    endpoint_path: str
    dsn: str
    settings: EndpointSettings
    receiver_id: str
    deployment_id: str = ""
    """The deployment's id: its committed counts are kept under it
    (``transactions.counting``); empty: the receiver keeps no committed counts."""
    otel_environment: dict[str, str] = {}
    """With ``settings.tracing``: the deploying process's ``OTEL_*`` variables."""


class ReceiverStatus(msgspec.Struct, frozen=True, kw_only=True):
    receiver_id: str
    pid: int
    node_id: str
    allowance: int
    slots: int
    in_flight: int
    processed: int
    failed: int
    moved_to_error: int
    delayed_retries: int
    processing_seconds: float
    draining: bool
    throttled: bool
    receive_breaker: str
    processing_breaker: str
    critical_error: str | None
    """The critical error still in effect: cleared once every breaker has disarmed again."""
    outbox_duplicates: int = 0
    """Messages whose id the outbox had recorded already: acknowledged without handlers."""
    critical_errors: int = 0
    """Critical errors raised so far (the peeker acts on each new one, even when it is over
    by the time it asks)."""
    last_critical_error: str | None = None
    settled_doomed: list[uuid.UUID] = []
    """Ids the peeker marked doomed (crash ledger) that this receiver no longer holds: moved to
    the error queue."""
    event_loop: str = ""
    """The class of the receiver's event loop (``uvloop.Loop``: Ray picks uvloop whenever it
    can be imported, and it is a dependency; see docs/performance.md)."""
    collector_thresholds: tuple[int, int, int] = (0, 0, 0)
    """The garbage collector's thresholds in the receiver's process since it started
    (:mod:`endpoint_runtime.runtime.collector`)."""


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``module.Class`` of an event loop: ``uvloop.Loop``, or asyncio's
    ``asyncio.unix_events._UnixSelectorEventLoop``."""
    kind = type(loop)
    return f"{kind.__module__}.{kind.__qualname__}"


class Receiver:
    """Plain class; :data:`ReceiverActor` is its Ray actor form."""

    def __init__(self, config: ReceiverConfig, *, own_process: bool = True) -> None:
        """``own_process``: the process is this receiver's (a Ray actor's), so it configures
        the process's logging and its start tunes the garbage collector; ``False`` where it
        shares a process (in process: :mod:`endpoint_runtime.runtime.in_process`), whose
        settings stay as they are."""
        if own_process:
            configure_logging()
        self.config = config
        self._own_process = own_process
        self.drained = False
        """:meth:`drain` ran to its end (its connections are closed)."""
        self._allowance = 0
        self._slots: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._draining = False
        self._shrunk = asyncio.Event()
        self._pool: asyncpg.Pool | None = None
        self._event_loop = ""
        self._collector_thresholds = (0, 0, 0)
        self._listener: Listener | None = None
        self._waiting: Waiting | None = None
        """With ``notify_on_send``: the queue's waiting mark (transport.waiting)."""
        self._throttled = False
        self._critical_error: str | None = None
        self._critical_errors = 0
        self._last_critical_error: str | None = None
        self._endpoint: Endpoint | None = None
        self._throttling_enabled = bool(config.settings.throttle_after_failures)
        self._receive_breaker = self._breaker("receive")
        self._processing_breaker = self._breaker("processing")
        self._store_breaker: CircuitBreaker | None = None
        self._ledger: CrashLedger | None = None
        self._doomed: DoomedMessages | None = None
        self._metrics: RayMetrics | None = None
        self._telemetry: Any = None
        """With ``settings.tracing``: the OpenTelemetry SDK of this process
        (:class:`endpoint_runtime.chain.tracing.setup.Telemetry`)."""
        self._counts: ReceiverCounts | None = None

    def _node_id(self) -> str:
        """The Ray node of this receiver's process; ``local`` for one in another's process."""
        return _node_id() if self._own_process else LOCAL_NODE

    def _breaker(self, name: str) -> CircuitBreaker:
        settings = self.config.settings
        return CircuitBreaker(
            name,
            time_to_trigger=settings.circuit_breaker_time_to_trigger,
            on_triggered=self._on_critical_error,
            armed_delay=settings.circuit_breaker_armed_delay,
            triggered_delay=settings.circuit_breaker_triggered_delay,
            on_disarmed=self._breaker_disarmed,
        )

    def _breakers(self) -> list[CircuitBreaker]:
        extra = [self._store_breaker] if self._store_breaker is not None else []
        return [self._receive_breaker, self._processing_breaker, *extra]

    def _breaker_disarmed(self) -> None:
        """The critical error is over once every breaker works again (the database is back)."""
        if self._critical_error is not None and all(
            b.state is BreakerState.DISARMED for b in self._breakers()
        ):
            log.info("critical_error_over", error=self._critical_error)
            self._critical_error = None

    def _on_critical_error(self, message: str, exc: BaseException) -> None:
        """Reported to the peeker through :meth:`status` (which applies the settings' action)
        and passed to the endpoint's ``on_critical_error`` hooks."""
        self._critical_error = self._last_critical_error = message
        self._critical_errors += 1
        for hook in self._endpoint.critical_error_handlers if self._endpoint else ():
            _run_hook(hook, message, exc)

    async def start(self, doomed: dict[uuid.UUID, str] | None = None) -> dict[str, Any]:
        """Connect and get ready; ``doomed``: the ids the peeker's crash ledger has seen kill
        too many receivers (see :mod:`endpoint_runtime.runtime.actors.crash_ledger`)."""
        settings = self.config.settings
        endpoint = self._endpoint = load_endpoint(self.config.endpoint_path)
        max_slots = settings.slots_per_receiver
        transport = settings.transport
        self._pool = await connect_pool(
            transport.pool_dsn(self.config.dsn), min_size=1,
            max_size=receiver_pool_size(max_slots),
            transaction_pooling=transport.transaction_pooling,
        )
        if transport.notify_on_send:
            if transport.transaction_pooling:
                # LISTEN cannot go through the pooler: the peeker, which listens on a direct
                # connection, wakes this receiver through Ray (its ``wake``).
                self._waiting = Waiting(endpoint.address)
            else:
                await self._listen(endpoint)
        structlog.contextvars.bind_contextvars(endpoint=endpoint.name)
        # The ids of the messages in the steps, in a file that outlives this process: one
        # memory write when a message enters the crash-ledger step and one when it leaves.
        # Created once the connections are up: a start that fails (no connection left) leaves
        # no file behind. The chain is built with it, the receiver's metrics and the delayed
        # store's circuit breaker.
        self._ledger = CrashLedger.create(self.config.receiver_id, records=max_slots)
        self._metrics = RayMetrics(endpoint.name)
        if settings.tracing:  # imported only when on
            from endpoint_runtime.runtime.actors.telemetry import start_receiver_telemetry

            self._telemetry = start_receiver_telemetry(
                endpoint.name, str(endpoint.address), self._metrics,
                receiver_id=self.config.receiver_id, environment=self.config.otel_environment)
        self._pipeline = endpoint.create_pipeline(
            settings, metrics=self._metrics, in_flight=self._ledger,
            guard_store=self._guard_store)
        self._doomed = DoomedMessages(self._pipeline.failures)
        self._doomed.sync(doomed or {})
        self._strategy = endpoint.create_strategy(self._pipeline, self._pool, settings)
        self._counts = ReceiverCounts(
            counts_table(endpoint.address), deployment_id=self.config.deployment_id,
            receiver_id=self.config.receiver_id, node_id=self._node_id())
        await self._counts.clean_up(self._pool)
        # Everything allocated so far lives as long as the process; messages flow from now on.
        self._collector_thresholds = (tune_receiver_process() if self._own_process
                                      else gc.get_threshold())
        self._event_loop = loop_name(asyncio.get_running_loop())
        log.info("receiver_started", receiver=self.config.receiver_id, pid=os.getpid(),
                 event_loop=self._event_loop)
        return {"pid": os.getpid(), "node_id": self._node_id(), "ledger": str(self._ledger.path)}

    def _guard_store(self, store: DelayedMessageStore) -> DelayedMessageStore:
        """The delayed store behind a circuit breaker of its own (a critical error when it
        keeps failing)."""
        delayed = self.config.settings.delayed_delivery
        self._store_breaker = CircuitBreaker(
            "delayed-store",
            time_to_trigger=delayed.time_to_trigger_store_circuit_breaker,
            on_triggered=self._on_critical_error,
            on_disarmed=self._breaker_disarmed,
        )
        return CircuitBreakingStore(store, self._store_breaker)

    async def _listen(self, endpoint: Endpoint) -> None:
        self._listener = Listener(self.config.dsn)
        await self._listener.start()
        # Before the strategy exists: a wake-up starts no slot while the allowance is 0.
        await self._listener.listen(endpoint.address.notify_channel, lambda: self.wake(1))
        self._waiting = Waiting(endpoint.address)

    # -- control (Ray calls) ----------------------------------------------------------------

    async def set_allowance(self, allowance: int) -> int:
        """Most slots this receiver may run; returns once at most that many run."""
        self._allowance = max(0, allowance)
        while len(self._slots) > self._allowance:
            self._shrunk.clear()
            await self._shrunk.wait()
        return len(self._slots)

    def wake(self, hint: int = 1) -> int:
        """Start up to ``hint`` slots (within the allowance); returns slots running."""
        if self._draining:
            return len(self._slots)
        room = self._effective_allowance - len(self._slots)
        for _ in range(max(0, min(hint, room))):
            self._start_slot()
        return len(self._slots)

    def status(self, doomed: dict[uuid.UUID, str] | None = None) -> ReceiverStatus:
        """Counters and state; ``doomed`` (only when it changed): the peeker's doomed ids."""
        if doomed is not None and self._doomed is not None:
            self._doomed.sync(doomed)
        stats = self._pipeline.stats
        return ReceiverStatus(
            receiver_id=self.config.receiver_id,
            pid=os.getpid(),
            node_id=self._node_id(),
            allowance=self._allowance,
            slots=len(self._slots),
            in_flight=self._in_flight,
            processed=stats.processed,
            failed=stats.failed,
            moved_to_error=stats.moved_to_error,
            delayed_retries=stats.delayed_retries,
            processing_seconds=stats.processing_seconds,
            draining=self._draining,
            throttled=self._throttled,
            receive_breaker=self._receive_breaker.state.value,
            processing_breaker=self._processing_breaker.state.value,
            critical_error=self._critical_error,
            outbox_duplicates=stats.outbox_duplicates,
            critical_errors=self._critical_errors,
            last_critical_error=self._last_critical_error,
            settled_doomed=self._doomed.settled() if self._doomed else [],
            event_loop=self._event_loop,
            collector_thresholds=self._collector_thresholds,
        )

    async def drain(self, grace_seconds: float) -> ReceiverStatus:
        """Stop receiving; let in-flight messages finish within ``grace_seconds``, then cancel
        them (their transactions roll back, so the rows come back to the queue)."""
        self._draining = True
        self._allowance = 0
        slots = list(self._slots)
        if slots:
            _, pending = await asyncio.wait(slots, timeout=grace_seconds)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("drain_timeout_cancelled", cancelled=len(pending))
                await asyncio.gather(*pending, return_exceptions=True)
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        if self._pool is not None:
            await close_pool(self._pool)
        if self._metrics is not None:  # started: its chain counted
            await self._metrics.close()
        if self._ledger is not None:
            self._ledger.close()
        if self._telemetry is not None:  # the last spans and metrics leave now
            await self._telemetry.close()
        self.drained = True
        log.info("receiver_stopped", receiver=self.config.receiver_id)
        return self.status()

    # -- slots ------------------------------------------------------------------------------

    def _start_slot(self) -> None:
        task = asyncio.get_running_loop().create_task(self._slot())
        self._slots.add(task)
        task.add_done_callback(self._slot_ended)

    def _slot_ended(self, task: asyncio.Task[None]) -> None:
        self._slots.discard(task)
        self._shrunk.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("slot_crashed", exc_info=task.exception())

    async def _slot(self) -> None:
        empty = False
        try:
            empty = await self._receive_until_empty()
        finally:
            # Leave the set at once (not in the done callback) so that the next slot to
            # check the allowance sees the right count.
            task = asyncio.current_task()
            if task is not None:
                self._slots.discard(task)
            self._shrunk.set()
        if empty and not self._slots and self._waiting is not None and not self._draining:
            await self._wait_for_wake_up()

    async def _wait_for_wake_up(self) -> None:
        """The last slot found the queue empty: mark the queue waiting, so that the next send
        notifies; when this call made the mark, look once more (a send committed since the
        empty receive notified nobody)."""
        assert self._pool is not None
        assert self._waiting is not None
        if await self._waiting.mark(self._pool):
            self.wake(1)

    async def _receive_until_empty(self) -> bool:
        """Receive until a round takes nothing (``True``), or until this slot must end
        (allowance, draining, a failure: ``False``)."""
        assert self._pool is not None
        successes = 0
        try:
            connection = await self._pool.acquire()
        except Exception as exc:
            await self._back_off(exc)
            return False
        assert self._counts is not None
        slot = self._strategy.open_slot(connection)
        number = self._counts.slot_opened(slot)
        try:
            try:
                await self._counts.ensure_row(slot, number, connection)
            except Exception as exc:  # a refused counts table comes as the error naming the fix
                await self._back_off(exc)
                return False
            while not self._draining and len(self._slots) <= self._effective_allowance:
                self._in_flight += 1
                try:
                    result = await slot.round()
                except RecoverabilityFailedError as exc:
                    # Rolled back: the message comes again. A critical error, as in the
                    # original, counted by the processing breaker (which also waits).
                    log.error("recoverability_failed", error=str(exc), cause=repr(exc.__cause__))
                    self._on_critical_error(str(exc), exc)
                    await self._processing_breaker.failure(exc)
                    continue
                except Exception as exc:
                    # The transport failed (connection lost, database down): this slot ends
                    # after the breaker's pause and a fresh one, on a fresh connection, goes on.
                    await self._back_off(exc)
                    return False
                finally:
                    self._in_flight -= 1
                self._receive_breaker.success()
                if result.taken == 0:
                    return True
                if result.handled:
                    self._processing_breaker.success()
                if self._throttling_enabled:  # a call less per message when it is off
                    await self._throttle(result)
                successes += 1
                if successes >= GROW_AFTER_SUCCESSES:
                    successes = 0
                    self.wake(1)
            return False
        finally:
            try:
                await slot.close()  # none mode writes its last counts there
            finally:
                self._counts.slot_closed(number)
                await self._pool.release(connection)

    @property
    def _effective_allowance(self) -> int:
        return min(self._allowance, 1) if self._throttled else self._allowance

    async def _throttle(self, result: Round) -> None:
        """Outage throttling: after N consecutive failures run one message at a time and
        pause after each failure; one success restores the allowance."""
        limit = self.config.settings.throttle_after_failures
        if not limit:
            return
        failures = self._pipeline.stats.consecutive_failures
        if not self._throttled and failures >= limit:
            self._throttled = True
            log.warning("throttling_started", consecutive_failures=failures)
            for hook in self._endpoint.throttling_started_handlers if self._endpoint else ():
                _run_hook(hook)
        elif self._throttled and result.handled:
            self._throttled = False
            log.info("throttling_ended")
            for hook in self._endpoint.throttling_ended_handlers if self._endpoint else ():
                _run_hook(hook)
            self.wake(self._allowance)
        if self._throttled and result.failed:
            await asyncio.sleep(self.config.settings.throttle_delay)

    async def _back_off(self, exc: Exception) -> None:
        log.warning("receive_failed", error=f"{type(exc).__name__}: {exc}")
        await self._receive_breaker.failure(exc)
        if not self._draining:
            asyncio.get_running_loop().call_soon(self.wake, 1)


def _run_hook(hook: Callable[..., object], *args: object) -> None:
    try:
        hook(*args)
    except Exception:
        log.exception("hook_failed", hook=getattr(hook, "__qualname__", repr(hook)))


def _node_id() -> str:
    """The Ray node of this process; ``local`` outside Ray (in process), where asking Ray's
    runtime context would start a local Ray."""
    if ray.is_initialized():
        with contextlib.suppress(Exception):
            return str(ray.get_runtime_context().get_node_id())
    return LOCAL_NODE


ReceiverActor = ray.remote(Receiver)
"""Ray actor form of :class:`Receiver` (options are set by the peeker)."""

