"""The delayed-message mover: dispatches due delayed messages to their destination queues.

One per endpoint deployment (a task of the peeker). Each round runs in one transaction:
fetch the next due message (row locked, SKIP LOCKED) -> insert it into its destination ->
remove it, up to ``batch_size`` messages, then commit. Each message succeeds or fails alone: a
dispatch that fails (e.g. the destination queue does not exist, or its name is not a queue
name) is rolled back to its savepoint, counted and postponed, and the round goes on; after
``number_of_retries`` failures the message goes to the error queue with ``FailedQ`` naming the
destination (if that move fails too, it stays in the store and is tried again later). Between
rounds the mover sleeps until the next due time by the database's clock, or a back-off (500 ms
doubling to 60 s) when nothing waits, and wakes early on the store's NOTIFY (any process
storing a message). An ``on_dispatched`` observer hears of every dispatch attempt (a traced
endpoint's spans, ``endpoint_runtime.chain.tracing.delivery``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import asyncpg
import structlog

from endpoint_runtime.connections.circuit_breakers import CircuitBreaker, CriticalErrorHandler
from endpoint_runtime.delayed.store import DelayedMessage, DelayedMessageStore
from endpoint_runtime.delayed.undeliverable import move_undeliverable
from endpoint_runtime.settings import DelayedDeliverySettings
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.transport.listening import Listener

log = structlog.get_logger("endpoint_runtime.delayed")


DispatchObserver = Callable[[DelayedMessage, int, "Exception | None", str], None]
"""Called after each dispatch attempt with the message, when the attempt started (ns since
the epoch), its failure (or ``None``) and what became of the message: ``dispatched``,
``error_queue`` (failed too often) or ``postponed`` (stays in the store)."""


class RateLimiter:
    """At most ``per_second`` events per second (the recovery-failure limit)."""

    def __init__(self, per_second: float) -> None:
        self._interval = 1.0 / per_second if per_second > 0 else 0.0
        self._next = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        if now < self._next:
            await asyncio.sleep(self._next - now)
        self._next = max(now, self._next) + self._interval


class DelayedMessageMover:
    def __init__(
        self,
        *,
        store: DelayedMessageStore,
        pool: asyncpg.Pool,
        dsn: str,
        endpoint: str,
        schema: str,
        error_address: QueueAddress,
        settings: DelayedDeliverySettings,
        on_critical_error: CriticalErrorHandler,
        listener: Listener | None = None,
        on_dispatched: DispatchObserver | None = None,
    ) -> None:
        """``listener``: a LISTEN connection to share (each listening backend is signalled on
        every NOTIFY in the database, so one per deployment is cheaper than one per task);
        without it the mover opens its own from ``dsn``. ``on_dispatched``: see
        :data:`DispatchObserver`."""
        self.store = store
        self._on_dispatched = on_dispatched
        self._shared_listener = listener
        self._pool = pool
        self._dsn = dsn
        self._endpoint = endpoint
        self._schema = schema
        self._error_address = error_address
        self.settings = settings
        self._wake = asyncio.Event()
        self._stopping = False
        self._listener: Listener | None = None
        self._recovery = RateLimiter(settings.maximum_recovery_failures_per_second)
        self.fetch_breaker = CircuitBreaker(
            "delayed-fetch", time_to_trigger=settings.time_to_trigger_fetch_circuit_breaker,
            on_triggered=on_critical_error,
        )
        self.dispatch_breaker = CircuitBreaker(
            "delayed-dispatch", time_to_trigger=settings.time_to_trigger_dispatch_circuit_breaker,
            on_triggered=on_critical_error,
        )
        self.dispatched = 0
        self.moved_to_error = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Move due messages until :meth:`stop`."""
        await self._listen()
        backoff = self.settings.initial_backoff
        while not self._stopping:
            # Cleared before the round, so a NOTIFY that arrives during it is not lost.
            self._wake.clear()
            try:
                moved, next_due = await self.move_due()
                self.fetch_breaker.success()
            except Exception as exc:
                log.warning("delayed_fetch_failed", error=f"{type(exc).__name__}: {exc}")
                await self.fetch_breaker.failure(exc)
                continue
            if moved >= self.settings.batch_size:
                continue  # more may be due right now
            if next_due is None:
                wait = backoff
                backoff = min(backoff * 2, self.settings.max_backoff)
            else:
                backoff = self.settings.initial_backoff
                wait = min(max(next_due, 0.0), self.settings.max_backoff)
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)

    def _on_notify(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        channel = self.store.notify_channel
        if self._shared_listener is not None and channel is not None:
            await self._shared_listener.unlisten(channel, self._on_notify)
        if self._listener is not None:
            await self._listener.close()

    async def _listen(self) -> None:
        channel = self.store.notify_channel
        if channel is None:
            return
        try:
            if self._shared_listener is not None:
                await self._shared_listener.listen(channel, self._on_notify)
                return
            self._listener = Listener(self._dsn)
            await self._listener.start()
            await self._listener.listen(channel, self._on_notify)
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("delayed_listen_failed", error=str(exc))  # polling still works

    async def move_due(self) -> tuple[int, float | None]:
        """One round: dispatch up to ``batch_size`` due messages in one transaction.

        Each message succeeds or fails alone, in its own savepoint: a failed one is counted
        (the built-in store also postpones it, so the messages due after it go first) and the
        round goes on with the next. Returns the number dispatched (or moved to the error
        queue) and the seconds until the next due message (``None`` when the store is empty).
        """
        moved = 0
        failed: set[tuple[object, str]] = set()
        async with self._pool.acquire() as connection:
            async with connection.transaction():
                for _ in range(self.settings.batch_size):
                    message = await self.store.fetch_next_due(connection)
                    if message is None or (message.id, message.destination) in failed:
                        break  # a store that does not postpone hands the failed one back
                    if await self._dispatch(connection, message):
                        moved += 1
                    else:
                        failed.add((message.id, message.destination))
            next_due = await self.store.next_due_in(connection)
        return moved, next_due

    async def _dispatch(self, connection: DatabaseConnection, message: DelayedMessage) -> bool:
        """Dispatch one message, or count its failure; ``False``: it stays in the store."""
        started = time.time_ns() if self._on_dispatched is not None else 0
        error = await self._send(connection, message)
        if error is None:
            self._observe(message, started, None, "dispatched")
            return True
        moved = await self._dispatch_failed(connection, message, error)
        self._observe(message, started, error, "error_queue" if moved else "postponed")
        return moved

    async def _send(self, connection: DatabaseConnection,
                    message: DelayedMessage) -> Exception | None:
        """Into its destination and out of the store, in a savepoint; the failure, if any."""
        try:
            async with connection.transaction():  # savepoint: a failure undoes only this one
                destination = QueueAddress.parse(message.destination, self._schema)
                await sending.send_raw(
                    connection, destination, message.id, message.headers, message.body
                )
                await self.store.remove(connection, message)
        except Exception as exc:
            log.warning("delayed_dispatch_failed", destination=message.destination,
                        message_id=str(message.id), failures=message.failures + 1,
                        error=f"{type(exc).__name__}: {exc}")
            return exc
        self.dispatch_breaker.success()
        self.dispatched += 1
        return None

    async def _dispatch_failed(self, connection: DatabaseConnection, message: DelayedMessage,
                               error: Exception) -> bool:
        """Count the failure; to the error queue after too many (``True``: it went)."""
        await self._recovery.wait()
        if message.failures + 1 > self.settings.number_of_retries:
            try:
                async with connection.transaction():
                    await self._move_to_error_queue(connection, message, error)
                return True
            except Exception as exc:  # e.g. the error queue is missing: try again later
                log.error("delayed_message_to_error_queue_failed",
                          destination=message.destination, message_id=str(message.id),
                          error_queue=str(self._error_address),
                          error=f"{type(exc).__name__}: {exc}")
                error = exc
        await self.store.increment_failure_count(connection, message)
        self.dispatch_breaker.record_failure(error)
        return False

    def _observe(self, message: DelayedMessage, started: int, error: Exception | None,
                 outcome: str) -> None:
        if self._on_dispatched is None:
            return
        try:
            self._on_dispatched(message, started, error, outcome)
        except Exception:  # an observer never stops the mover
            log.exception("delayed_dispatch_observer_failed")

    async def _move_to_error_queue(
        self, connection: DatabaseConnection, message: DelayedMessage, exc: Exception
    ) -> None:
        await move_undeliverable(connection, self._error_address, message, exc, self._endpoint)
        await self.store.remove(connection, message)
        self.moved_to_error += 1
        log.error("delayed_message_to_error_queue", destination=message.destination,
                  message_id=str(message.id), error_queue=str(self._error_address))
