"""Endpoints of the committed-counts tests, one per transaction mode (importable by path).

The handler inserts the message's ``n`` into the table ``counted`` (created by the tests), the
business data the committed counts must match. ``Count(behaviour=...)``: ``fail`` always raises
(the error queue after the retries), ``flaky`` raises at its first attempt in each receiver
process (then a retry handles it; by message id, so a deployment in process, which shares the
test's process, sees its own messages fail once too), ``slow`` sleeps a little first (a load
to kill receivers in).
A failing attempt raises before it writes anything: in none mode the insert would commit at once.
"""

from __future__ import annotations

import asyncio

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.settings import OutboxSettings


class Count(msgspec.Struct):
    n: int
    behaviour: str = "ok"  # ok | fail | flaky | slow


_failed_once: set[str] = set()


async def count(message: Count, context: HandlerContext) -> None:
    if message.behaviour == "fail":
        raise RuntimeError(f"count {message.n} always fails")
    if message.behaviour == "flaky" and context.message_id not in _failed_once:
        _failed_once.add(context.message_id)
        raise RuntimeError(f"count {message.n} fails once")
    if message.behaviour == "slow":
        await asyncio.sleep(0.02)
    await context.connection.execute("INSERT INTO counted (n) VALUES ($1)", message.n)


def make(name: str, mode: TransactionMode, **options: object) -> Endpoint:
    retries = 0 if mode is TransactionMode.NONE else 2  # none mode cannot retry
    endpoint = Endpoint(name, transaction_mode=mode, immediate_retries=retries,
                        delayed_retries=0, max_concurrency=4, **options)  # type: ignore[arg-type]
    endpoint.register(count)
    return endpoint


atomic = make("counted_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE)
receive_only = make("counted_receive_only", TransactionMode.RECEIVE_ONLY)
batched = make("counted_batched", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, batch_size=4)
with_outbox = make("counted_outbox", TransactionMode.RECEIVE_ONLY, outbox=OutboxSettings())
none = make("counted_none", TransactionMode.NONE)
"""At most once: a failed message goes to the error queue at once, flaky ones too."""
