"""Endpoints fed hostile rows by the fuzz tests, one per transaction mode (importable by path).

The handler fails for a negative ``n``; else it replies (when ``n`` is odd: the reply address
comes from the hostile headers) or sends to ``fuzz_sink`` (copying conversation and
correlation headers from the incoming ones), then records ``n`` in ``fuzz_handled``. Nothing
is written before the last step that can fail, so a row is either handled once or not at all.
"""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.settings import OutboxSettings
from endpoint_runtime.wire.serialization import message_type_name

SINK = "fuzz_sink"
HANDLED_TABLE = "fuzz_handled"


class Fuzzed(msgspec.Struct):
    n: int
    text: str = ""


class Echo(msgspec.Struct):
    n: int
    text: str = ""


FUZZED_TYPE = message_type_name(Fuzzed)


async def handle(message: Fuzzed, context: HandlerContext) -> None:
    if message.n < 0:
        raise ValueError(f"fuzzed failure {message.n}")
    if message.n % 2:
        await context.reply(Echo(message.n, message.text))
    else:
        await context.send(Echo(message.n, message.text), SINK)
    await context.connection.execute(
        f"INSERT INTO {HANDLED_TABLE} (endpoint, n) VALUES ($1, $2)", context.endpoint,
        message.n)


def make(name: str, mode: TransactionMode, **options: object) -> Endpoint:
    retries = {} if mode is TransactionMode.NONE else {"immediate_retries": 1,
                                                       "delayed_retries": 1}
    endpoint = Endpoint(name, transaction_mode=mode, delayed_retry_delay=0.2,
                        max_concurrency=2, slots_per_receiver=2,
                        **retries, **options)  # type: ignore[arg-type]
    endpoint.register(handle)
    return endpoint


atomic = make("fuzz_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE)
receive_only = make("fuzz_receive_only", TransactionMode.RECEIVE_ONLY)
batched = make("fuzz_batched", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, batch_size=4)
none = make("fuzz_none", TransactionMode.NONE)
with_outbox = make("fuzz_outbox", TransactionMode.RECEIVE_ONLY, outbox=OutboxSettings())

ENDPOINTS = {"atomic": atomic, "receive_only": receive_only, "batched": batched, "none": none,
             "outbox": with_outbox}
