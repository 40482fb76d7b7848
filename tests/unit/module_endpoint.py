"""An endpoint at module level, for the import-path and deployment tests."""

import msgspec

from endpoint_runtime import Endpoint, HandlerContext

endpoint = Endpoint("module-level")


class Ping(msgspec.Struct):
    n: int


@endpoint.handler
async def ping(message: Ping, context: HandlerContext) -> None:
    return None
