"""Circuit breakers: disarmed -> armed on the first failure -> triggered after a time
without success, which raises the critical error. A success disarms (also a triggered
breaker: work resumes by itself when the database is back, as in the original), and calls
``on_disarmed``.

Each failure waits before the caller tries again: 1 s while armed, 10 s once triggered (the
original's delays; both are settings so tests can run fast). Deadlocks (SQLSTATE 40P01) are
expected under contention and never count.

Example::

    breaker = CircuitBreaker("receive", time_to_trigger=30, on_triggered=critical_error)
    try:
        await receive()
        breaker.success()
    except Exception as exc:
        await breaker.failure(exc)
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable

import asyncpg
import structlog

log = structlog.get_logger("endpoint_runtime.connections.circuit_breakers")

CriticalErrorHandler = Callable[[str, BaseException], None]


class BreakerState(enum.StrEnum):
    DISARMED = "disarmed"
    ARMED = "armed"
    TRIGGERED = "triggered"


def counts_as_failure(exc: BaseException) -> bool:
    """Deadlocks are retried without counting against the breaker."""
    return not isinstance(exc, asyncpg.DeadlockDetectedError)


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        time_to_trigger: float,
        on_triggered: CriticalErrorHandler,
        armed_delay: float = 1.0,
        triggered_delay: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        on_disarmed: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.on_disarmed = on_disarmed
        """Called when a success disarms the breaker (never on the common path: only when it
        was armed or triggered), e.g. to declare a critical error over."""
        self.time_to_trigger = time_to_trigger
        self.on_triggered = on_triggered
        self.armed_delay = armed_delay
        self.triggered_delay = triggered_delay
        self._clock = clock
        self.state = BreakerState.DISARMED
        self._armed_at = 0.0

    def success(self) -> None:
        if self.state is not BreakerState.DISARMED:
            log.info("circuit_breaker_disarmed", breaker=self.name)
            self.state = BreakerState.DISARMED
            if self.on_disarmed is not None:
                self.on_disarmed()

    def record_failure(self, exc: BaseException) -> float:
        """Move the state on for a failure; returns the seconds to wait before retrying."""
        if not counts_as_failure(exc):
            return 0.0
        now = self._clock()
        if self.state is BreakerState.DISARMED:
            self.state = BreakerState.ARMED
            self._armed_at = now
            log.warning("circuit_breaker_armed", breaker=self.name, error=_describe(exc))
        if self.state is BreakerState.ARMED and now - self._armed_at >= self.time_to_trigger:
            self.state = BreakerState.TRIGGERED
            message = (f"circuit breaker {self.name!r} triggered: no success for "
                       f"{self.time_to_trigger:g} s; last error: {_describe(exc)}")
            log.critical("circuit_breaker_triggered", breaker=self.name, error=_describe(exc))
            self.on_triggered(message, exc)
        return self.triggered_delay if self.state is BreakerState.TRIGGERED else self.armed_delay

    async def failure(self, exc: BaseException) -> None:
        """Record a failure and wait the delay of the resulting state."""
        delay = self.record_failure(exc)
        if delay:
            await asyncio.sleep(delay)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]
