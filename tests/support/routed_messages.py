"""Message types for the routing tests: a module of its own, so that a route for the whole
module (``endpoint.route("tests.support.routed_messages", to=...)``) covers exactly these."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint
from endpoint_runtime.wire.message_kinds import Command, Event


class ChargeCard(msgspec.Struct, Command):
    n: int


class ShipParcel(msgspec.Struct, Command):
    n: int


class CardCharged(msgspec.Struct, Event):
    n: int


def _web() -> Endpoint:
    endpoint = Endpoint("web", send_only=True)
    endpoint.route(ChargeCard, to="payments")
    return endpoint


web = _web()
"""A send-only endpoint whose routes ``endpoint-runtime send --routes-of`` can use."""
