"""Commands and events: the marker types, what each kind allows, and that the markers stay out
of wire names and topics (pure logic, no database)."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.chain.handlers import HandlerRegistry
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.subscriptions import topics_of
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.runtime.endpoint import Endpoint
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.message_kinds import (
    Command,
    Event,
    MessageKind,
    check_publishable,
    check_subscribable,
    commands,
    kind_of,
    subscribable,
)
from endpoint_runtime.wire.messages import Headers, MessageIntent, TransportMessage
from endpoint_runtime.wire.serialization import message_type_name
from tests.support.recording import RecordingDispatcher


class PlaceOrder(msgspec.Struct, Command):
    order_id: str


class RushOrder(PlaceOrder):
    """A subclass of a command is a command."""


class OrderPlaced(msgspec.Struct, Event):
    order_id: str


class PriorityOrderPlaced(OrderPlaced):
    priority: int = 1


class Note(msgspec.Struct):
    """Declares neither: a plain message."""

    text: str


class Confused(msgspec.Struct, Command, Event):
    pass


def test_the_markers_declare_the_kind_and_subclasses_inherit_it() -> None:
    assert kind_of(PlaceOrder) is MessageKind.COMMAND
    assert kind_of(RushOrder) is MessageKind.COMMAND
    assert kind_of(OrderPlaced) is MessageKind.EVENT
    assert kind_of(PriorityOrderPlaced) is MessageKind.EVENT
    assert kind_of(Note) is MessageKind.MESSAGE


def test_a_type_declared_both_a_command_and_an_event_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="both a command and an event"):
        kind_of(Confused)

    async def handle(message: Confused, context: HandlerContext) -> None:
        pass

    with pytest.raises(ConfigurationError, match="both a command and an event"):
        HandlerRegistry().register(handle)


def test_the_markers_are_in_no_wire_name_nor_topic() -> None:
    assert topics_of(PriorityOrderPlaced) == (
        f"{__name__}.PriorityOrderPlaced", f"{__name__}.OrderPlaced")
    assert topics_of(RushOrder) == (f"{__name__}.RushOrder", f"{__name__}.PlaceOrder")
    assert message_type_name(PlaceOrder) == f"{__name__}.PlaceOrder"
    assert msgspec.json.decode(msgspec.json.encode(PlaceOrder("1")), type=PlaceOrder) == (
        PlaceOrder("1"))


def test_a_command_cannot_be_published_nor_subscribed_to() -> None:
    for command in (PlaceOrder, RushOrder):
        with pytest.raises(ConfigurationError, match="is a command"):
            check_publishable(command)
        with pytest.raises(ConfigurationError, match="is a command"):
            check_subscribable(command)
    for other in (OrderPlaced, PriorityOrderPlaced, Note):
        check_publishable(other)
        check_subscribable(other)


def test_an_outgoing_publish_of_a_command_is_refused_and_a_send_of_it_is_not() -> None:
    with pytest.raises(ConfigurationError, match=r"cannot publish .*PlaceOrder"):
        create_outgoing(PlaceOrder("1"), intent=MessageIntent.PUBLISH)
    sent = create_outgoing(PlaceOrder("1"), intent=MessageIntent.SEND)
    assert sent.headers[Headers.MESSAGE_INTENT] == "Send"
    for published in (OrderPlaced("1"), Note("hi")):
        outgoing = create_outgoing(published, intent=MessageIntent.PUBLISH)
        assert outgoing.headers[Headers.MESSAGE_INTENT] == "Publish"


def test_an_endpoint_subscribes_to_all_but_commands_and_prunes_the_commands() -> None:
    handled = [PlaceOrder, OrderPlaced, Note, RushOrder]
    assert subscribable(handled) == [OrderPlaced, Note]
    assert commands(handled) == [PlaceOrder, RushOrder]


def test_a_handler_publishing_a_command_fails_before_anything_is_dispatched() -> None:
    recorder = RecordingDispatcher()
    incoming = TransportMessage(native_id=uuid.uuid4(), seq=1, headers={}, raw_headers="{}",
                                body=b"{}")
    # A subscription store that is never reached: the refusal comes first.
    context = HandlerContext(message=incoming, endpoint="sales",
                             local_address=QueueAddress("sales"), dispatcher=recorder,
                             connection=None, subscriptions=Unreachable())  # type: ignore[arg-type]

    with pytest.raises(ConfigurationError, match="cannot publish"):
        asyncio.run(context.publish(PlaceOrder("1")))
    assert recorder.sent == []


class Unreachable:
    """A subscription store that fails the test if publishing reaches it at all."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the subscription store was used ({name}) for a command")


def test_an_endpoint_refuses_to_subscribe_to_a_command_before_connecting() -> None:
    endpoint = Endpoint("kinds_unit")  # no database: the refusal comes first
    with pytest.raises(ConfigurationError, match=r"cannot subscribe to .*PlaceOrder"):
        asyncio.run(endpoint.subscribe(PlaceOrder))
