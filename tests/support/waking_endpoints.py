"""Endpoints of the waking and throttling tests (importable by path, as receivers need).

Handlers write what they handled into the table ``handled`` (created by the tests).
"""

from __future__ import annotations

import asyncio
import itertools

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Ping(msgspec.Struct):
    key: str


async def _handle(message: Ping, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO handled (key) VALUES ($1)", message.key)


# No receiver while idle: the first message must wake the deployment.
on_demand = Endpoint("on_demand", min_receivers=0, scale_down_after=0.5, max_concurrency=2,
                     slots_per_receiver=2)
on_demand.register(_handle)
# One receiver kept while idle, with a LISTEN connection of its own beside the peeker's.
kept = Endpoint("kept", min_receivers=1, max_concurrency=2, slots_per_receiver=2)
kept.register(_handle)

HOLD = 4546
"""An advisory lock the waiting-mark test holds while its backlog waits (shared by handlers)."""

# Its handlers wait on that lock: a backlog that the peeker sees queued.
held = Endpoint("held", min_receivers=1, max_concurrency=2, slots_per_receiver=2)


@held.handler
async def _handle_when_released(message: Ping, context: HandlerContext) -> None:
    await context.connection.execute("SELECT pg_advisory_xact_lock_shared($1)", HOLD)
    await _handle(message, context)


# -- throttling ------------------------------------------------------------------------------


class Flaky(msgspec.Struct):
    n: int


class Report(msgspec.Struct):
    """Sent at once by each handler run: whether the receiver was throttled when it started,
    and how many handler runs that started after throttling began were running (itself
    included)."""

    n: int
    throttled: bool
    concurrent_since_throttled: int
    concurrent: int


_running: set[int] = set()
_before_throttling: set[int] | None = None
"""The runs in flight when throttling started; ``None`` while not throttled."""
_runs = itertools.count()

throttled = Endpoint("throttled", transaction_mode="receive_only", throttle_after_failures=2,
                     throttle_delay=0.05, max_concurrency=4, slots_per_receiver=4,
                     immediate_retries=1000, delayed_retries=0)


@throttled.on_throttling_started
def _throttling_started() -> None:
    global _before_throttling
    _before_throttling = set(_running)


@throttled.on_throttling_ended
def _throttling_ended() -> None:
    global _before_throttling
    _before_throttling = None


@throttled.handler
async def _fail_slowly(message: Flaky, context: HandlerContext) -> None:
    run = next(_runs)
    _running.add(run)
    try:
        before = _before_throttling
        since = len(_running - before) if before is not None else 0
        await context.send(Report(n=message.n, throttled=before is not None,
                                  concurrent_since_throttled=since, concurrent=len(_running)),
                           destination="reports", immediate=True)
        await asyncio.sleep(0.2)  # long enough for runs to overlap
    finally:
        _running.discard(run)
    raise RuntimeError("always fails: the endpoint stays throttled")


# -- endpoint-runtime run -------------------------------------------------------------------


class Nap(msgspec.Struct):
    key: str
    seconds: float


async def _nap(message: Nap, context: HandlerContext) -> None:
    # In the database, so a test sees the handler in flight in pg_stat_activity.
    await context.connection.execute("SELECT pg_sleep($1)", message.seconds)
    await context.connection.execute("INSERT INTO handled (key) VALUES ($1)", message.key)


# A graceful stop waits up to two minutes for a handler in flight.
napping = Endpoint("napping", max_concurrency=2, slots_per_receiver=2, stop_timeout=120)
napping.register(_nap)
