"""An endpoint whose handler always fails (importable by path)."""

from __future__ import annotations

import asyncio

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Doomed(msgspec.Struct):
    n: int


doomed = Endpoint("doomed", immediate_retries=0, delayed_retries=0)


@doomed.handler
async def fail(message: Doomed, context: HandlerContext) -> None:
    raise RuntimeError(f"doomed {message.n}")


none_mode = Endpoint("fire_and_forget", transaction_mode="none")


@none_mode.handler
async def ask_for_retry(message: Doomed, context: HandlerContext) -> None:
    from datetime import timedelta

    from endpoint_runtime.chain.recoverability.policy import RetryLater

    raise RetryLater(timedelta(seconds=1))


doomed_at_most_once = Endpoint("doomed_none", transaction_mode="none")
doomed_at_most_once.register(fail)


stalled = Endpoint("stalled_none", transaction_mode="none")


@stalled.handler
async def stall(message: Doomed, context: HandlerContext) -> None:
    await asyncio.Event().wait()  # until cancelled
