"""Endpoints the throughput benchmark deploys (receivers import them by path)."""

from __future__ import annotations

import time

import msgspec

from endpoint_runtime import Endpoint, HandlerContext

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
