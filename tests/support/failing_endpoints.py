"""An endpoint whose handler always fails (importable by path)."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Doomed(msgspec.Struct):
    n: int


doomed = Endpoint("doomed", immediate_retries=0, delayed_retries=0)


@doomed.handler
async def fail(message: Doomed, context: HandlerContext) -> None:
    raise RuntimeError(f"doomed {message.n}")
