"""An endpoint module the environment tests import themselves, under an environment they
choose (``tests/integration/test_environment_at_start.py``); nothing else imports it."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransportSettings


class Note(msgspec.Struct):
    text: str


async def _note(message: Note, context: HandlerContext) -> None:
    """Never runs: the tests install the endpoint, they do not deploy it."""


# Everything from the environment (the DSN above all).
from_environment = Endpoint("late_environment")
from_environment.register(_note)
# One transport field set in code: it wins over the environment, then and later.
peek_in_code = Endpoint("late_peek", transport=TransportSettings(peek_delay=0.7))
peek_in_code.register(_note)
