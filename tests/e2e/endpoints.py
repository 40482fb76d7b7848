"""Endpoints and handlers of the end-to-end tests.

Receiver actors import these by path (``tests.e2e.endpoints:atomic_endpoint``), as they
would a user's module. Handlers leave evidence only in the database: business rows through
``context.connection`` (they commit or roll back with the message) and, to count attempts
whatever the outcome, ``immediate=True`` sends to an ``attempts`` queue (committed at once,
on another connection). Each test creates the tables and destination queues it needs.
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class HandlerFailedError(Exception):
    """What the failing handlers raise."""


class Attempt(msgspec.Struct):
    """One handler invocation, sent immediately to the ``attempts`` queue."""

    n: int
    pid: int


class Out(msgspec.Struct):
    """What handlers send on."""

    n: int


async def record_attempt(context: HandlerContext, n: int) -> None:
    await context.send(Attempt(n=n, pid=os.getpid()), destination="attempts", immediate=True)


# -- failure after a send, one endpoint per transaction mode --------------------------------


class FailAfterSend(msgspec.Struct):
    n: int


# Delayed retries off: after 1 + immediate_retries attempts the message goes to the error queue.
failing_atomic = Endpoint(
    "failing",
    transaction_mode="sends_atomic_with_receive",
    immediate_retries=1,
    delayed_retries=0,
)
failing_receive_only = Endpoint(
    "failing", transaction_mode="receive_only", immediate_retries=1, delayed_retries=0
)
failing_none = Endpoint("failing", transaction_mode="none")  # retries unset: none in this mode


async def fail_after_send(message: FailAfterSend, context: HandlerContext) -> None:
    await record_attempt(context, message.n)
    await context.connection.execute("INSERT INTO business (n) VALUES ($1)", message.n)
    await context.send(Out(message.n), destination="out")
    raise HandlerFailedError(f"failure after send of {message.n}")


for _endpoint in (failing_atomic, failing_receive_only, failing_none):
    _endpoint.register(fail_after_send)


# -- immediate sends and outgoing de-duplication (atomic) -----------------------------------


class ImmediateThenFail(msgspec.Struct):
    n: int


class SendTwice(msgspec.Struct):
    n: int
    out_id: str


immediate_endpoint = Endpoint("immediate", immediate_retries=0, delayed_retries=0)


@immediate_endpoint.handler
async def immediate_then_fail(message: ImmediateThenFail, context: HandlerContext) -> None:
    await context.send(Out(message.n), destination="audit", immediate=True)
    await context.connection.execute("INSERT INTO business (n) VALUES ($1)", message.n)
    await context.send(Out(message.n), destination="out")
    raise HandlerFailedError("failure after an immediate send")


@immediate_endpoint.handler
async def send_twice(message: SendTwice, context: HandlerContext) -> None:
    # Same id, same destination, twice: one row. Same id to another queue: a row there too.
    await context.send(Out(message.n), destination="out", message_id=message.out_id)
    await context.send(Out(message.n), destination="out", message_id=message.out_id)
    await context.send(Out(message.n), destination="audit", message_id=message.out_id,
                       immediate=True)
    await context.send(Out(message.n), destination="audit", message_id=message.out_id,
                       immediate=True)


# -- several handlers of one type, in registration order -----------------------------------


class Ordered(msgspec.Struct):
    n: int


class Unrelated(msgspec.Struct):
    n: int


ordered_endpoint = Endpoint("ordered")


async def record_call(context: HandlerContext, n: int, handler: str) -> None:
    await context.connection.execute(
        "INSERT INTO handler_calls (n, handler, txid, message_id) "
        "VALUES ($1, $2, txid_current(), $3)",
        n, handler, context.message_id,
    )


@ordered_endpoint.handler
async def first_handler(message: Ordered, context: HandlerContext) -> None:
    await record_call(context, message.n, "first")


@ordered_endpoint.handler
async def unrelated_handler(message: Unrelated, context: HandlerContext) -> None:
    await record_call(context, message.n, "unrelated")


@ordered_endpoint.handler
async def second_handler(message: Ordered, context: HandlerContext) -> None:
    await record_call(context, message.n, "second")


@ordered_endpoint.handler
async def third_handler(message: Ordered, context: HandlerContext) -> None:
    await record_call(context, message.n, "third")


# -- replies --------------------------------------------------------------------------------


class Request(msgspec.Struct):
    n: int


class Response(msgspec.Struct):
    n: int


replier_endpoint = Endpoint("replier")


@replier_endpoint.handler
async def answer(message: Request, context: HandlerContext) -> None:
    await context.reply(Response(message.n * 10))


# -- concurrency limit -----------------------------------------------------------------------


class Timed(msgspec.Struct):
    n: int
    batch: int


concurrency_endpoint = Endpoint("concurrency", max_concurrency=4, slots_per_receiver=2)


@concurrency_endpoint.handler
async def timed(message: Timed, context: HandlerContext) -> None:
    started = await context.connection.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(0.05)
    await context.connection.execute(
        "INSERT INTO intervals (n, batch, started, ended, pid) "
        "VALUES ($1, $2, $3, clock_timestamp(), $4)",
        message.n, message.batch, started, os.getpid(),
    )


# -- graceful stop ----------------------------------------------------------------------------


class Slow(msgspec.Struct):
    n: int


graceful_endpoint = Endpoint("graceful")


@graceful_endpoint.handler
async def slow(message: Slow, context: HandlerContext) -> None:
    await context.send(Out(message.n), destination="started", immediate=True)
    await asyncio.sleep(1.5)
    await context.connection.execute("INSERT INTO business (n) VALUES ($1)", message.n)


# -- a receiver killed mid-message -------------------------------------------------------------


class Fragile(msgspec.Struct):
    n: int


crash_endpoint = Endpoint("crashy", max_concurrency=1)


@crash_endpoint.handler
async def fragile(message: Fragile, context: HandlerContext) -> None:
    await record_attempt(context, message.n)
    attempts = await context.connection.fetchval("SELECT count(*) FROM attempts")
    if attempts == 1:
        await asyncio.sleep(60)  # the test kills this receiver meanwhile
    await context.connection.execute("INSERT INTO business (n) VALUES ($1)", message.n)


# -- scaling receivers up and down -------------------------------------------------------------


class Busy(msgspec.Struct):
    n: int


scaling_endpoint = Endpoint(
    "scaling", max_concurrency=4, slots_per_receiver=1, min_receivers=1, scale_down_after=1.0
)


BUSY_HOLD = 4545
"""An advisory lock the scaling test holds while its backlog waits: every slot that takes a
message waits for it (shared), so a second receiver surely takes some before the first is done."""


@scaling_endpoint.handler
async def busy(message: Busy, context: HandlerContext) -> None:
    await context.connection.execute("SELECT pg_advisory_xact_lock_shared($1)", BUSY_HOLD)
    started = await context.connection.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(0.25)
    await context.connection.execute(
        "INSERT INTO business (n, pid, started, ended) VALUES ($1, $2, $3, clock_timestamp())",
        message.n,
        os.getpid(),
        started,
    )


# -- LISTEN/NOTIFY wake-up ---------------------------------------------------------------------


class Wake(msgspec.Struct):
    n: int


wakeup_endpoint = Endpoint("wakeup")


@wakeup_endpoint.handler
async def woken(message: Wake, context: HandlerContext) -> None:
    await context.connection.execute(
        "INSERT INTO handled (n, at) VALUES ($1, clock_timestamp())", message.n
    )


# -- batched atomic receive --------------------------------------------------------------------


class Work(msgspec.Struct):
    n: int
    fail: bool = False


# One receiver (2 slots): the in-memory failure counts of a message stay in one process.
batched_endpoint = Endpoint(
    "batched",
    batch_size=10,
    immediate_retries=2,
    delayed_retries=0,
    max_concurrency=2,
    slots_per_receiver=2,
)


@batched_endpoint.handler
async def work(message: Work, context: HandlerContext) -> None:
    await record_attempt(context, message.n)
    await context.connection.execute(
        "INSERT INTO business (n, txid) VALUES ($1, txid_current())", message.n
    )
    await context.send(Out(message.n), destination="done")
    if message.fail:
        raise HandlerFailedError(f"work {message.n} always fails")


# -- poison and undecodable input --------------------------------------------------------------


class Typed(msgspec.Struct):
    n: int


strict_endpoint = Endpoint("strict", max_concurrency=1)  # default retries (5 immediate, 3 delayed)


@strict_endpoint.handler
async def typed(message: Typed, context: HandlerContext) -> None:
    await record_attempt(context, message.n)
    await context.connection.execute("INSERT INTO business (n) VALUES ($1)", message.n)
