"""The endpoint of the failover test (importable by path, as receivers need): each message's
key into ``handled``, in the receive transaction (atomic mode: once, or not at all)."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Ping(msgspec.Struct):
    key: int


failover = Endpoint("failover", min_receivers=1, max_concurrency=4, slots_per_receiver=2)


@failover.handler
async def _handle(message: Ping, context: HandlerContext) -> None:
    await context.connection.execute("INSERT INTO handled (key) VALUES ($1)", message.key)
