"""Endpoints of the hardening tests: database outages, receivers that die, connection budgets.

Handlers write what they handled into the table ``handled`` (created by the tests).
"""

from __future__ import annotations

import os

import msgspec

from endpoint_runtime import Endpoint, HandlerContext


class Work(msgspec.Struct):
    key: str
    behaviour: str = "ok"  # ok | die (os._exit in the handler)


async def _handle(message: Work, context: HandlerContext) -> None:
    if message.behaviour == "die":
        os._exit(17)  # as a native crash or an out-of-memory kill would: no cleanup at all
    await context.connection.execute("INSERT INTO handled (key) VALUES ($1)", message.key)


# Short breaker times: a few seconds of outage trigger them (30 s by default).
_OUTAGE = dict(
    circuit_breaker_time_to_trigger=2.0, circuit_breaker_armed_delay=0.2,
    circuit_breaker_triggered_delay=0.5, max_concurrency=2, slots_per_receiver=2,
)
outage_log = Endpoint("outage_log", on_critical_error="log", **_OUTAGE)
outage_stop = Endpoint("outage_stop", on_critical_error="stop", **_OUTAGE)
outage_log.register(_handle)
outage_stop.register(_handle)

# One receiver of one slot: each death takes exactly the message it was handling.
crashing = Endpoint("crashing", max_concurrency=1, slots_per_receiver=1)
crashing.register(_handle)

# Many receivers: their worst case of connections is far above a small server's limit.
wide = Endpoint("wide", max_concurrency=256, slots_per_receiver=4)
wide.register(_handle)


class Doomed(msgspec.Struct):
    """Always fails: with no retries it goes to the error queue at once."""

    n: int


async def _fail(message: Doomed, context: HandlerContext) -> None:
    raise RuntimeError(f"doomed {message.n}")


# A failed message goes to the error queue at once; short breaker times as above.
_NO_RETRIES = dict(_OUTAGE, immediate_retries=0, delayed_retries=0, max_concurrency=1,
                   slots_per_receiver=1)
processing_log = Endpoint("processing_log", on_critical_error="log", **_NO_RETRIES)
# on_critical_error left to its default.
default_action = Endpoint("default_action", **_NO_RETRIES)
for _endpoint in (processing_log, default_action):
    _endpoint.register(_handle)
    _endpoint.register(_fail)
