"""The endpoint of the failover tests (importable by path, as receivers need): each message's
key into ``handled``, in the receive transaction (atomic mode: once, or not at all); a
message with ``raises`` raises that built-in exception, goes to the error queue at once and
is recorded there by ingestion (the console groups failures by exception type); every
handled message is audited (queue ``audit``)."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Ping(msgspec.Struct):
    key: int
    raises: str | None = None
    """``RuntimeError`` or ``ValueError``."""


FAILURES: dict[str, type[Exception]] = {"RuntimeError": RuntimeError, "ValueError": ValueError}


failover = Endpoint("failover", min_receivers=1, max_concurrency=4, slots_per_receiver=2,
                    audit_queue="audit", immediate_retries=0, delayed_retries=0)


@failover.handler
async def _handle(message: Ping, context: HandlerContext) -> None:
    if message.raises is not None:
        raise FAILURES[message.raises](f"failover poison {message.key}")
    await context.connection.execute("INSERT INTO handled (key) VALUES ($1)", message.key)
