"""Handler shapes without a database: ``(message)`` alone with ``current_context()``, and
handlers that return the messages they cascade (events published, the rest sent by route)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from endpoint_runtime import (
    Command,
    Endpoint,
    EndpointRuntimeError,
    Event,
    HandlerContext,
    HandlerReturnError,
    RoutingError,
    current_context,
)
from endpoint_runtime.testing import invoke


class PlaceOrder(msgspec.Struct, Command):
    order_id: str


class BillOrder(msgspec.Struct, Command):
    order_id: str


class OrderPlaced(msgspec.Struct, Event):
    order_id: str


class Unrouted(msgspec.Struct):
    order_id: str


def test_a_handler_may_take_the_message_alone_and_reach_its_context() -> None:
    endpoint = Endpoint("sales")
    seen: list[str] = []

    @endpoint.handler
    async def place(message: PlaceOrder) -> None:
        seen.append(current_context().message_id)

    context = asyncio.run(invoke(endpoint, PlaceOrder("1")))
    assert seen == [context.message_id]


def test_current_context_outside_a_handler_says_so() -> None:
    with pytest.raises(EndpointRuntimeError, match="only available while a handler runs"):
        current_context()


def test_returned_messages_are_sent_by_route_or_published_in_order() -> None:
    endpoint = Endpoint("sales")
    endpoint.route(BillOrder, to="billing")

    @endpoint.handler
    async def place(message: PlaceOrder, context: HandlerContext) -> list[msgspec.Struct]:
        return [BillOrder(message.order_id), OrderPlaced(message.order_id)]

    @endpoint.handler(message_type=PlaceOrder)
    async def also(message: PlaceOrder) -> BillOrder:  # one message, the other shape
        return BillOrder(message.order_id + "-again")

    context = asyncio.run(invoke(endpoint, PlaceOrder("1"),
                                 subscribers={OrderPlaced: ["analytics"]}))
    assert [(r.intent, r.message, r.destinations) for r in context.recorded] == [
        ("Send", BillOrder("1"), ("billing",)),
        ("Publish", OrderPlaced("1"), ("analytics",)),
        ("Send", BillOrder("1-again"), ("billing",)),
    ]


@pytest.mark.parametrize("returned", [42, "BillOrder", {"order_id": "1"}, [BillOrder("1"), 3]])
def test_a_handler_returning_what_is_not_a_message_fails_and_sends_nothing(
        returned: object) -> None:
    endpoint = Endpoint("sales")
    endpoint.route(BillOrder, to="billing")

    @endpoint.handler
    async def place(message: PlaceOrder) -> object:
        return returned

    with pytest.raises(HandlerReturnError, match=r"returned .*: a handler returns None, a "
                                                  r"message"):
        asyncio.run(invoke(endpoint, PlaceOrder("1")))


def test_a_returned_command_without_a_route_is_a_routing_error() -> None:
    endpoint = Endpoint("sales")

    @endpoint.handler
    async def place(message: PlaceOrder) -> Unrouted:
        return Unrouted(message.order_id)

    with pytest.raises(RoutingError, match=r"no route for .*Unrouted"):
        asyncio.run(invoke(endpoint, PlaceOrder("1")))
