from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from endpoint_runtime.connections.circuit_breakers import BreakerState, CircuitBreaker
from endpoint_runtime.delayed.store import CircuitBreakingStore, DelayedMessage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock, triggered: list[str]) -> CircuitBreaker:
    return CircuitBreaker("receive", time_to_trigger=30, clock=clock,
                          on_triggered=lambda message, exc: triggered.append(message))


def test_armed_on_first_failure_triggered_after_the_time_without_success() -> None:
    clock, triggered = Clock(), []
    subject = breaker(clock, triggered)

    assert subject.record_failure(OSError("down")) == 1.0  # armed: wait 1 s
    assert subject.state is BreakerState.ARMED
    clock.now += 29
    assert subject.record_failure(OSError("down")) == 1.0
    assert triggered == []
    clock.now += 1
    assert subject.record_failure(OSError("still down")) == 10.0  # triggered: wait 10 s
    assert subject.state is BreakerState.TRIGGERED
    assert len(triggered) == 1
    assert "receive" in triggered[0]
    assert "still down" in triggered[0]
    subject.record_failure(OSError("again"))
    assert len(triggered) == 1  # raised once, not at every failure


def test_a_success_disarms() -> None:
    clock, triggered = Clock(), []
    subject = breaker(clock, triggered)
    subject.record_failure(OSError("blip"))
    subject.success()
    assert subject.state is BreakerState.DISARMED
    clock.now += 60
    subject.record_failure(OSError("new outage"))  # armed anew, not triggered
    assert subject.state is BreakerState.ARMED
    assert triggered == []


def test_deadlocks_do_not_count() -> None:
    clock, triggered = Clock(), []
    subject = breaker(clock, triggered)
    assert subject.record_failure(asyncpg.DeadlockDetectedError("deadlock detected")) == 0.0
    assert subject.state is BreakerState.DISARMED


class FailingStore:
    notify_channel = None

    def __init__(self) -> None:
        self.fail = True

    async def store(self, connection: object, message: DelayedMessage) -> None:
        if self.fail:
            raise OSError("store unavailable")


def test_store_breaker_follows_store_calls() -> None:
    clock, triggered = Clock(), []
    inner = FailingStore()
    store = CircuitBreakingStore(inner, breaker(clock, triggered))  # type: ignore[arg-type]
    message = DelayedMessage(id=uuid.uuid4(), destination="q", due=datetime.now(UTC),
                             headers="{}", body=b"")

    async def attempt() -> None:
        await store.store(None, message)  # type: ignore[arg-type]

    with pytest.raises(OSError, match="store unavailable"):
        asyncio.run(attempt())
    clock.now += 31
    with pytest.raises(OSError, match="store unavailable"):
        asyncio.run(attempt())
    assert store.breaker.state is BreakerState.TRIGGERED
    assert len(triggered) == 1
    inner.fail = False
    asyncio.run(attempt())
    assert store.breaker.state is BreakerState.DISARMED
