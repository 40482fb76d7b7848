"""Endpoints the throughput benchmark deploys (receivers import them by path)."""

from __future__ import annotations

import time

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, Outbox
from endpoint_runtime.ingestion import IngestionEndpoint

SINK = "bench_sink"


class Work(msgspec.Struct):
    """Sent by the benchmark; ``sent_at`` is the sender's wall clock."""

    __message_type_name__ = "Benchmarks.Messages.Work"
    n: int
    sent_at: float


class Echo(msgspec.Struct):
    __message_type_name__ = "Benchmarks.Messages.Echo"
    n: int
    sent_at: float
    started_at: float


async def echo(message: Work, context: HandlerContext) -> None:
    """The workload: no business logic, one outgoing message (atomic with the receive)."""
    started = time.time()
    await context.send(Echo(message.n, message.sent_at, started), destination=SINK)


atomic = Endpoint("bench_atomic")
atomic.register(echo)

batched = Endpoint("bench_batched", batch_size=50)
batched.register(echo)


async def record_and_echo(message: Work, context: HandlerContext) -> None:
    """The outbox workload: one business insert and one outgoing message."""
    started = time.time()
    await context.connection.execute("INSERT INTO bench_business (n) VALUES ($1)", message.n)
    await context.send(Echo(message.n, message.sent_at, started), destination=SINK)


atomic_business = Endpoint("bench_atomic_business")
atomic_business.register(record_and_echo)

outbox_business = Endpoint("bench_outbox", transaction=Outbox())
outbox_business.register(record_and_echo)

# The outbox with every commit synchronous, as atomic mode's: the equal-durability comparison.
outbox_sync_business = Endpoint("bench_outbox_sync", transaction=Outbox(synchronous_acks=True))
outbox_sync_business.register(record_and_echo)


class Timed(msgspec.Struct):
    """A message that knows when it should be handled (epoch seconds)."""

    __message_type_name__ = "Benchmarks.Messages.Timed"
    n: int
    due: float


async def record_lateness(message: Timed, context: HandlerContext) -> None:
    started = time.time()
    await context.connection.execute(
        "INSERT INTO bench_lateness (n, lateness_ms) VALUES ($1, $2)",
        message.n, (started - message.due) * 1000,
    )


delayed_target = Endpoint("bench_delayed")
delayed_target.register(record_lateness)


# The ingestion benchmark's ingestion endpoint: audit queue bench_audit into audit_log.
ingestion = IngestionEndpoint("bench_audit", error_queue="bench_error")
