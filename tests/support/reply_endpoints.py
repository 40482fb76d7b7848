"""Endpoints that reply to whatever ``ReplyToAddress`` a message carries (importable by path).

The hostile-input tests send them messages whose reply address names a business table or a
table in another schema: the reply must fail, and the message reach the error queue.
"""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.settings import OutboxSettings


class Ping(msgspec.Struct):
    text: str = ""


class Pong(msgspec.Struct):
    text: str = ""


def make(name: str, mode: TransactionMode, **options: object) -> Endpoint:
    retries = {} if mode is TransactionMode.NONE else {"immediate_retries": 1}
    endpoint = Endpoint(name, transaction_mode=mode, delayed_retries=0,
                        **retries, **options)  # type: ignore[arg-type]

    @endpoint.handler
    async def reply(message: Ping, context: HandlerContext) -> None:
        await context.reply(Pong(message.text))

    return endpoint


atomic = make("replier_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE)
receive_only = make("replier_receive_only", TransactionMode.RECEIVE_ONLY)
batched = make("replier_batched", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, batch_size=4)
none = make("replier_none", TransactionMode.NONE)
with_outbox = make("replier_outbox", TransactionMode.RECEIVE_ONLY, outbox=OutboxSettings())
