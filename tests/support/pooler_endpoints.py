"""Endpoints of the tests behind PgBouncer (importable by path, as receivers need).

Handlers write what they handled into the table ``handled`` (created by the tests).
"""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Ping(msgspec.Struct):
    key: str


class Pong(msgspec.Struct):
    key: str


# Two receivers of four slots, one kept while idle: eight slots on the pooler's two server
# connections, in the default mode (one connection per slot).
pooled = Endpoint("pooled", min_receivers=1, max_concurrency=8, slots_per_receiver=4)


@pooled.handler
async def _handle(message: Ping, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO handled (key) VALUES ($1)", message.key)
    await context.send(Pong(message.key), "pongs")
