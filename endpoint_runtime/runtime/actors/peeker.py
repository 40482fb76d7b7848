"""PeekerActor: watches one endpoint's queue and keeps the right receivers running.

Loop: peek (max-min estimate over unlocked rows) -> check receivers (replace dead ones,
counting a death for each message they were handling: :mod:`.crash_ledger`) ->
scale to the policy of :mod:`endpoint_runtime.runtime.actors.scaling` -> wake idle receivers when
messages wait -> sleep until the peek delay passes or a NOTIFY arrives. Allowance decreases are
confirmed before increases are handed out, so at most ``max_concurrency`` messages are in
flight across the deployment at any moment.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Any

import asyncpg
import msgspec
import ray
import structlog

from endpoint_runtime.connections.circuit_breakers import BreakerState, CircuitBreaker
from endpoint_runtime.connections.connecting import close_pool, connect_pool
from endpoint_runtime.connections.connection_budget import PEEKER_POOL_SIZE
from endpoint_runtime.logging import configure_logging
from endpoint_runtime.runtime.actors import scaling
from endpoint_runtime.runtime.actors.background import BackgroundWork
from endpoint_runtime.runtime.actors.crash_ledger import (
    MAX_RECEIVER_DEATHS,
    DeathTally,
    ledger_path,
)
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig, DeploymentStatus
from endpoint_runtime.runtime.actors.ray_metrics import RayMetrics
from endpoint_runtime.runtime.actors.receiver import ReceiverStatus
from endpoint_runtime.runtime.actors.receiver_handles import (
    RayReceivers,
    ReceiverHandle,
    ReceiverHosting,
    last_line,
)
from endpoint_runtime.runtime.heartbeats import Heartbeat
from endpoint_runtime.settings import replace as replace_settings
from endpoint_runtime.transport import receiving
from endpoint_runtime.transport.listening import Listener
from endpoint_runtime.transport.waiting import Waiting

log = structlog.get_logger("endpoint_runtime.peeker")

MIN_CYCLE_SECONDS = 0.1
STATUS_TIMEOUT_SECONDS = 10.0
RECEIVER_START_TIMEOUT_SECONDS = 60.0
"""How long a new receiver may take to be placed and started before the peeker gives up on
it (and tries again at its next cycle)."""
LEDGER_READ_TIMEOUT_SECONDS = 30.0


class PeekerNotes(msgspec.Struct, frozen=True, kw_only=True):
    """What a peeker tells its driver beside the :class:`DeploymentStatus`."""

    unresponsive_receivers: list[str] = []
    """Receivers that did not answer the last status call in time and are still counted
    (a node lost: Ray declares it dead after some seconds, and the peeker replaces them)."""
    replaced_by: str | None = None
    """The deployment id of a new deployment that replaces this one (``submit --replace``)."""


class Peeker:
    """Plain class; :data:`PeekerActor` is its Ray actor form."""

    def __init__(self, config: DeploymentConfig, hosting: ReceiverHosting | None = None) -> None:
        self._hosting: ReceiverHosting = hosting or RayReceivers()
        """Where the receivers run: Ray actors, or objects on this loop (tests, in process)."""
        if self._hosting.own_process:  # in another's process, its logging stays its own
            configure_logging()
        structlog.contextvars.bind_contextvars(endpoint=config.endpoint_name)
        self.config = config
        self.settings = config.settings
        self._receivers: list[ReceiverHandle] = []
        self._estimate = 0
        self._metrics = RayMetrics(config.endpoint_name)
        self._telemetry: Any = None
        """With ``settings.tracing``: this process's OpenTelemetry SDK (the queue length)."""
        self._idle_since = time.monotonic()
        self._wake = asyncio.Event()
        self._woken: set[asyncio.Future[Any]] = set()  # wake-ups fanned out, not answered yet
        self._stopping = False
        self._replaced = 0
        self._unresponsive: set[str] = set()
        """Receivers whose last status call timed out (their node may be lost)."""
        self._replaced_by: str | None = None
        self._lock = asyncio.Lock()
        self._loop_task: asyncio.Task[None] | None = None
        self._pool: asyncpg.Pool | None = None
        self._listener: Listener | None = None
        self._waiting = (Waiting(config.address) if config.settings.transport.notify_on_send
                         else None)
        """The queue's waiting mark: sends notify only while it is there (transport.waiting)."""
        self._background = BackgroundWork()
        """The delayed-message mover, the outbox cleaner, the endpoint's periodic tasks."""
        self.critical_error: str | None = None
        self.last_critical_error: str | None = None
        self._halted = False
        # The counts of the endpoint's previous peeker on this node, if any: a peeker lost
        # and restarted does not give a message that kills receivers three more deaths.
        self._tally = DeathTally.of(config.settings.transport.dsn or "",
                                    config.address.qualified)
        self._deaths = self._tally.load()
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
        self._heartbeat = Heartbeat(config.address.schema, config.deployment_id)
        self._retired_processed = 0
        self._retired_failed = 0
        self._retired_moved_to_error = 0
        self._retired_outbox_duplicates = 0
        self._retired_by_node: collections.Counter[str] = collections.Counter()

    def _count_retired(self, last: ReceiverStatus | None) -> None:
        if last is not None:
            self._retired_processed += last.processed
            self._retired_failed += last.failed
            self._retired_moved_to_error += last.moved_to_error
            self._retired_outbox_duplicates += last.outbox_duplicates
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
        breakers = [self._peek_breaker, *self._background.breakers]
        if any(b.state is not BreakerState.DISARMED for b in breakers):
            return
        if any(h.last is None or h.last.critical_error for h in self._receivers):
            return
        log.info("critical_error_over", error=self.critical_error)
        self.critical_error = None

    async def start(self) -> None:
        if self.settings.tracing:  # imported only when on
            from endpoint_runtime.runtime.actors.telemetry import start_peeker_telemetry

            self._telemetry = start_peeker_telemetry(
                self.config.endpoint_name, str(self.config.address), self._metrics,
                environment=self.config.otel_environment)
        transport = self.settings.transport
        self._pool = await connect_pool(transport.pool_dsn(self.config.dsn), min_size=1,
                                        max_size=PEEKER_POOL_SIZE,
                                        transaction_pooling=transport.transaction_pooling)
        # One LISTEN connection for the peeker and the mover, always to the server itself (a
        # transaction-mode pooler cannot carry LISTEN): PostgreSQL signals every listening
        # backend on each NOTIFY in the database, so fewer listeners cost less.
        self._listener = Listener(self.config.dsn)
        await self._listener.start()
        if transport.notify_on_send:
            await self._listener.listen(
                self.config.address.notify_channel,
                self._fan_out_wake_up if transport.transaction_pooling else self._wake.set)
        await self._background.start(self.config, self.settings, self._pool, self._listener,
                                     self.on_critical_error, self._critical_error_maybe_over)
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
            assert self._pool is not None
            await self._heartbeat.beat(self._pool, await self.status())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=peek_delay)
            elapsed = time.monotonic() - started
            if elapsed < MIN_CYCLE_SECONDS:
                await asyncio.sleep(MIN_CYCLE_SECONDS - elapsed)

    async def _reconcile(self) -> None:
        assert self._pool is not None
        cap = self.settings.transport.max_records_to_peek
        self._estimate = await receiving.peek(self._pool, self.config.address, cap)
        self._metrics.queue_length(self._estimate)
        if self._halted or self._replaced_by is not None:
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
        if self._waiting is not None:
            await self._keep_waiting_mark(busy)
        if self._estimate > 0:
            await self._wake_idle()  # after a cleared mark, they mark it again once idle

    async def _keep_waiting_mark(self, busy: int) -> None:
        """Messages queued: no wake-up is needed, so the mark goes (sends stop notifying).
        Nothing queued or in flight: the endpoint waits; when this call made the mark, a
        send since the peek notified nobody, so the next cycle comes at once."""
        assert self._pool is not None
        assert self._waiting is not None
        if self._estimate > 0:
            await self._waiting.clear(self._pool)
        elif busy == 0 and await self._waiting.mark(self._pool):
            self._wake.set()

    async def _refresh_statuses(self, hand_over: bool = True) -> None:
        """Ask every receiver for its status (handing over the crash ledger's doomed ids when
        they changed); replace the ones that died, counting a death for each message they
        were handling, and hand the result to the others at once."""
        if not self._receivers:
            return
        version = self._deaths.version
        doomed = (self._deaths.snapshot()
                  if any(h.doomed_version < version for h in self._receivers) else None)
        asked = list(self._receivers)  # the list may change while the answers come
        results = await asyncio.gather(
            *(asyncio.wait_for(
                self._hosting.call(h, "status",
                                   doomed if h.doomed_version < version else None),
                STATUS_TIMEOUT_SECONDS)
              for h in asked),
            return_exceptions=True,
        )
        for handle, result in zip(asked, results, strict=True):
            if isinstance(result, ReceiverStatus):
                self._unresponsive.discard(handle.receiver_id)
                handle.last = result
                handle.doomed_version = version
                if result.settled_doomed:
                    self._deaths.settle(result.settled_doomed)
                    self._save_deaths()
                if result.critical_errors > handle.critical_errors_seen:
                    # Each new one, even if it is over already (a short outage).
                    handle.critical_errors_seen = result.critical_errors
                    error = result.last_critical_error or "critical error"
                    self.on_critical_error(error, RuntimeError(error))
            elif isinstance(result, self._hosting.lost):
                if handle not in self._receivers:
                    continue  # retired meanwhile: counted where it was retired
                log.warning("receiver_died", receiver=handle.receiver_id,
                            error=last_line(result))
                self._receivers.remove(handle)
                self._count_retired(handle.last)
                self._replaced += 1
                await self._count_deaths(handle, last_line(result))
            else:
                if isinstance(result, TimeoutError):
                    self._unresponsive.add(handle.receiver_id)
                log.warning("receiver_status_failed", receiver=handle.receiver_id,
                            error=repr(result)[:200])
        self._critical_error_maybe_over()
        if hand_over and any(h.doomed_version < self._deaths.version for h in self._receivers):
            await self._refresh_statuses(hand_over=False)

    async def _count_deaths(self, handle: ReceiverHandle, error: str) -> None:
        """A receiver died: count a death for each message its handlers were running (its
        crash ledger, read on its node)."""
        node_id = handle.node_id or (handle.last.node_id if handle.last else None)
        if node_id is None:
            return  # it died before it could take anything
        if not await asyncio.to_thread(self._hosting.node_alive, node_id):
            # The whole node went down (a machine lost, its raylet killed): the receiver's
            # connections closed with it and its messages rolled back. Not the messages' fault.
            log.warning("receiver_node_lost", receiver=handle.receiver_id, node=node_id[:12])
            return
        path = handle.ledger or str(ledger_path(handle.receiver_id))
        try:
            native_ids = await asyncio.wait_for(self._hosting.read_ledger(node_id, path),
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
        if native_ids:
            self._save_deaths()

    def _save_deaths(self) -> None:
        try:
            self._tally.save(self._deaths)
        except OSError as exc:  # the counts still hold in memory
            log.warning("death_tally_unwritable", path=str(self._tally.path),
                        error=f"{type(exc).__name__}: {exc}"[:500])

    async def _scale_to(self, wanted: int) -> None:
        while len(self._receivers) > wanted:
            handle = self._receivers.pop()
            await self._retire(handle)
        new: list[ReceiverHandle] = []
        missing = wanted - len(self._receivers)
        if missing > 0:
            # Even over the live nodes that have the resources asked for (all, unpinned);
            # when none has them, Ray places the receivers when one joins.
            candidates = await asyncio.to_thread(self._hosting.live_nodes,
                                                 self.settings.receiver_resources)
            nodes: list[str | None] = list(scaling.spread_over_nodes(
                candidates, [h.node_id for h in self._receivers], missing))
            nodes += [None] * (missing - len(nodes))
            new = [self._hosting.launch(self.config, self.settings, node) for node in nodes]
        if new:
            version, doomed = self._deaths.version, self._deaths.snapshot() or None
            started = await asyncio.gather(
                *(asyncio.wait_for(self._hosting.call(h, "start", doomed),
                                   RECEIVER_START_TIMEOUT_SECONDS) for h in new),
                return_exceptions=True,
            )
            for handle, result in zip(new, started, strict=True):
                if isinstance(result, TimeoutError):
                    # Ray could not place it (its resources taken, its node gone): the next
                    # cycle tries again, instead of this one waiting for ever.
                    log.error("receiver_start_failed", receiver=handle.receiver_id,
                              error=f"not started within {RECEIVER_START_TIMEOUT_SECONDS:g} s",
                              resources=self.settings.receiver_resources)
                    self._hosting.kill(handle)
                elif isinstance(result, BaseException):
                    log.error("receiver_start_failed", error=last_line(result),
                              cause=repr(getattr(result, "cause", None))[:2000])
                    self._hosting.kill(handle)
                else:
                    handle.node_id, handle.ledger = result["node_id"], result["ledger"]
                    handle.doomed_version = version
                    self._receivers.append(handle)
        await self._apply_allowances()

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

    async def _set_allowance(self, handle: ReceiverHandle, allowance: int) -> None:
        await self._hosting.call(handle, "set_allowance", allowance)
        handle.allowance = allowance

    def _fan_out_wake_up(self) -> None:
        """A NOTIFY behind a transaction-mode pooler, where receivers do not listen: wake one
        slot of each receiver that has room, through Ray (control only: the receivers take
        the messages from PostgreSQL), and peek at once."""
        self._wake.set()
        for handle in self._receivers:
            if handle.allowance > 0 and (handle.last is None
                                         or handle.last.slots < handle.allowance):
                call = asyncio.ensure_future(self._hosting.call(handle, "wake", 1))
                self._woken.add(call)
                call.add_done_callback(self._wake_up_answered)

    def _wake_up_answered(self, call: asyncio.Future[Any]) -> None:
        self._woken.discard(call)
        if not call.cancelled() and call.exception() is not None:
            # A receiver that died is found and replaced by the next cycle's status calls.
            log.debug("wake_up_failed", error=repr(call.exception())[:200])

    async def _wake_idle(self) -> None:
        share = max(1, -(-self._estimate // max(1, len(self._receivers))))
        await asyncio.gather(
            *(self._hosting.call(h, "wake", share) for h in self._receivers
              if h.allowance > 0 and (h.last is None or h.last.slots < h.allowance)),
            return_exceptions=True,
        )

    async def _retire(self, handle: ReceiverHandle) -> None:
        final = handle.last
        try:
            final = await self._hosting.call(handle, "drain", self.settings.stop_timeout)
        except self._hosting.lost as exc:
            await self._count_deaths(handle, last_line(exc))
        self._count_retired(final)
        self._hosting.kill(handle)
        log.info("receiver_retired", receiver=handle.receiver_id)

    # -- control (Ray calls) ----------------------------------------------------------------

    async def set_max_concurrency(self, max_concurrency: int) -> None:
        """Change the concurrency limit at runtime; takes effect before this returns."""
        async with self._lock:
            self.settings = replace_settings(self.settings, max_concurrency=max_concurrency)
            await self._reconcile()

    async def status(self, refresh: bool = False) -> DeploymentStatus:
        """The deployment's status; ``refresh`` asks every receiver now instead of reporting
        what they said at the last peek cycle."""
        if refresh:
            async with self._lock:
                await self._refresh_statuses()
        return self._status([h.last for h in self._receivers if h.last is not None])

    def _status(self, receivers: list[ReceiverStatus]) -> DeploymentStatus:
        mover = self._background.mover
        return DeploymentStatus(
            endpoint=self.config.endpoint_name,
            estimate=self._estimate,
            max_concurrency=self.settings.max_concurrency,
            receivers=receivers,
            replaced_receivers=self._replaced,
            delayed_dispatched=mover.dispatched if mover else 0,
            delayed_to_error=mover.moved_to_error if mover else 0,
            critical_error=self.critical_error,
            halted=self._halted,
            last_critical_error=self.last_critical_error,
            doomed_messages=len(self._deaths.doomed),
            retired_processed=self._retired_processed,
            retired_failed=self._retired_failed,
            retired_moved_to_error=self._retired_moved_to_error,
            retired_outbox_duplicates=self._retired_outbox_duplicates,
            retired_by_node=dict(self._retired_by_node),
        )

    def notes(self) -> PeekerNotes:
        """What the driver's status lines say beside the status."""
        running = {h.receiver_id for h in self._receivers}
        return PeekerNotes(unresponsive_receivers=sorted(self._unresponsive & running),
                           replaced_by=self._replaced_by)

    async def request_replacement(self, by: str) -> None:
        """A new deployment of this endpoint (deployment id ``by``) runs (``submit
        --replace``): stop receiving (the receivers finish what they hold and are retired;
        none is started again) and tell the driver, which stops the deployment."""
        if self._replaced_by is not None or self._stopping:
            return
        log.info("replacement_requested", by=by)
        self._replaced_by = by
        asyncio.get_running_loop().create_task(self._stop_receiving())

    def node_id(self) -> str:
        """The Ray node this peeker runs on."""
        return self._hosting.this_node()

    async def receiver_pids(self) -> list[int]:
        async with self._lock:  # not while a peek cycle changes the receivers
            await self._refresh_statuses()
        return [h.last.pid for h in self._receivers if h.last is not None]

    async def stop(self) -> DeploymentStatus:
        """Graceful stop: receivers stop receiving, finish in-flight work, then exit."""
        self._stopping = True
        self._wake.set()
        await self._background.stop()
        async with self._lock:
            if self._loop_task is not None:
                self._loop_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop_task
            await self._refresh_statuses()
            timeout = self.settings.stop_timeout
            final = await asyncio.gather(
                *(self._hosting.call(h, "drain", timeout) for h in self._receivers),
                return_exceptions=True,
            )
            for handle in self._receivers:
                self._hosting.kill(handle)
            self._receivers.clear()
        stopped = self._status([s for s in final if isinstance(s, ReceiverStatus)])
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        if self._pool is not None:
            await self._heartbeat.beat(self._pool, stopped, stopped=True, force=True)
            await close_pool(self._pool)
        if self._telemetry is not None:  # the last queue length leaves now
            await self._telemetry.close()
        log.info("peeker_stopped")
        return stopped


PeekerActor = ray.remote(Peeker)
"""Ray actor form of :class:`Peeker`."""

# The deployment's description and status live in .deployment_status; named here too.
__all__ = ["DeploymentConfig", "DeploymentStatus", "Peeker", "PeekerActor", "PeekerNotes"]
