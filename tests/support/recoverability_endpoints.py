"""Endpoints for the recoverability, delayed-delivery and outbox end-to-end tests.

Handlers record what they see through ``immediate=True`` sends to an "attempts" queue: those
commit at once, so every attempt is counted even when its transaction rolls back.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, Outbox
from endpoint_runtime.chain.recoverability.policy import DiscardMessage, RetryLater

# Where the throttling hooks of "switched" write, in the receiver's process: the test's own
# temporary file, named by the messages (hooks get no arguments, and the receiver runs in a
# process of its own, so a test cannot hand it a path any other way).
hook_log: Path | None = None


class Charge(msgspec.Struct):
    key: str
    behaviour: str = "fail"  # fail | ok | unrecoverable | retry_later | discard | defer
    hook_log: str = ""  # "switched": the file its throttling hooks write to


class Attempt(msgspec.Struct):
    key: str
    retries: str


class Reminder(msgspec.Struct):
    key: str


class CardDeclined(Exception):
    """Listed as unrecoverable: no retries."""


async def record_attempt(message: Charge, context: HandlerContext) -> None:
    await context.send(
        Attempt(message.key, context.headers.get("NServiceBus.Retries", "0")),
        destination="attempts", immediate=True,
    )


retrying = Endpoint(
    "retrying", immediate_retries=2, delayed_retries=2, delayed_retry_delay=0.3,
    unrecoverable_exceptions=(CardDeclined,),
)


@retrying.handler
async def charge(message: Charge, context: HandlerContext) -> None:
    await record_attempt(message, context)
    if message.behaviour == "fail":
        raise ValueError(f"charge {message.key} failed")
    if message.behaviour == "unrecoverable":
        raise CardDeclined(message.key)
    if message.behaviour == "retry_later" and "NServiceBus.Retries" not in context.headers:
        raise RetryLater(timedelta(seconds=0.5))
    if message.behaviour == "discard":
        raise DiscardMessage("customer closed the account")
    if message.behaviour == "defer":
        await context.send_local(Reminder(message.key), delay=timedelta(seconds=0.6))
    await context.connection.execute("INSERT INTO charges (key) VALUES ($1)", message.key)


@retrying.handler
async def remind(message: Reminder, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO reminders (key) VALUES ($1)", message.key)


# Fails while the "switch" table says so: for replays from the error queue, throttling and
# circuit breakers.
switched = Endpoint(
    "switched", immediate_retries=0, delayed_retries=0, throttle_after_failures=3,
    throttle_delay=0.2, circuit_breaker_time_to_trigger=1.5, circuit_breaker_armed_delay=0.2,
    circuit_breaker_triggered_delay=0.3, on_critical_error="log", max_concurrency=2,
    slots_per_receiver=2,
)


@switched.handler
async def switched_charge(message: Charge, context: HandlerContext) -> None:
    global hook_log
    if message.hook_log:
        hook_log = Path(message.hook_log)
    await record_attempt(message, context)
    broken = await context.connection.fetchval("SELECT broken FROM switch")
    if broken:
        raise RuntimeError("downstream system unavailable")
    if message.behaviour == "slow":
        await asyncio.sleep(1.0)
    await context.connection.execute("INSERT INTO charges (key) VALUES ($1)", message.key)


def _hook_line(event: str) -> None:
    if hook_log is not None:
        with hook_log.open("a") as f:
            f.write(event + "\n")


switched.on_throttling_started(lambda: _hook_line("throttling_started"))
switched.on_throttling_ended(lambda: _hook_line("throttling_ended"))


# Outbox, for two deployments competing and for a kill between commit and dispatch.
class Pay(msgspec.Struct):
    invoice: str


class Paid(msgspec.Struct):
    invoice: str


HELD_PAY_LOCK = 4444
ledger = Endpoint("ledger", transaction=Outbox(pessimistic=True), immediate_retries=0,
                  delayed_retries=0, max_concurrency=2, slots_per_receiver=2)


@ledger.handler
async def pay(message: Pay, context: HandlerContext) -> None:
    await context.send(Paid(message.invoice), destination="handler_runs", immediate=True)
    if message.invoice.startswith("held"):  # waits while a test holds the lock
        await context.connection.execute("SELECT pg_advisory_xact_lock($1)", HELD_PAY_LOCK)
    await context.connection.execute("INSERT INTO paid (invoice) VALUES ($1)", message.invoice)
    await context.send(Paid(message.invoice), destination="paid_events")
