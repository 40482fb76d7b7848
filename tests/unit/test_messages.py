from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.errors import (
    ConfigurationError,
    MessageDecodeError,
    PoisonMessageError,
    UnknownMessageTypeError,
)
from endpoint_runtime.wire.messages import Headers, decode_headers, from_wire_time, to_wire_time
from endpoint_runtime.wire.serialization import MessageTypes, enclosed_type_names, message_type_name


class PlaceOrder(msgspec.Struct):
    order_id: str


class ShipOrder(msgspec.Struct):
    __message_type_name__ = "Shipping.Messages.ShipOrder"
    order_id: str


def test_wire_time_matches_nservicebus_format() -> None:
    moment = datetime(2026, 11, 22, 9, 5, 3, 123456, tzinfo=UTC)
    assert to_wire_time(moment) == "2026-11-22 09:05:03:123456 Z"
    assert from_wire_time("2026-11-22 09:05:03:123456 Z") == moment


def test_wire_time_needs_aware_datetimes() -> None:
    with pytest.raises(ValueError, match="aware"):
        to_wire_time(datetime(2026, 1, 1))


def test_headers_that_are_not_an_object_of_strings_are_poison() -> None:
    assert decode_headers('{"a":"b"}') == {"a": "b"}
    for raw in ("{not json", '["a"]', '{"a": 1}', ""):
        with pytest.raises(PoisonMessageError, match="metadata corruption"):
            decode_headers(raw)


def test_type_names_default_to_module_qualname_and_can_be_chosen() -> None:
    assert message_type_name(PlaceOrder) == f"{__name__}.PlaceOrder"
    assert message_type_name(ShipOrder) == "Shipping.Messages.ShipOrder"


class PriorityShipOrder(ShipOrder):
    """Sets no name of its own: it must not take its base's."""

    priority: int = 1


class NamedPriorityShipOrder(ShipOrder):
    __message_type_name__ = "Shipping.Messages.PriorityShipOrder"


def test_a_subclass_of_a_named_type_has_its_own_wire_name_unless_it_sets_one() -> None:
    assert message_type_name(PriorityShipOrder) == f"{__name__}.PriorityShipOrder"
    assert message_type_name(NamedPriorityShipOrder) == "Shipping.Messages.PriorityShipOrder"
    assert message_type_name(ShipOrder) == "Shipping.Messages.ShipOrder"


def test_a_named_type_and_its_subclass_are_both_known_and_resolve_apart() -> None:
    types = MessageTypes()
    types.add(ShipOrder)
    types.add(PriorityShipOrder)  # before the fix: "used by both"
    assert types.resolve("Shipping.Messages.ShipOrder") is ShipOrder
    assert types.resolve(f"{__name__}.PriorityShipOrder;Shipping.Messages.ShipOrder") is (
        PriorityShipOrder)


def test_enclosed_types_of_dotnet_senders_resolve() -> None:
    header = ("Shipping.Messages.ShipOrder, Shipping, Version=1.0.0.0, Culture=neutral; "
              "Shipping.Messages.IShipOrder, Shipping")
    assert enclosed_type_names(header) == ["Shipping.Messages.ShipOrder",
                                           "Shipping.Messages.IShipOrder"]
    types = MessageTypes()
    types.add(ShipOrder)
    assert types.resolve(header) is ShipOrder
    with pytest.raises(UnknownMessageTypeError):
        types.resolve("Nope")


def test_two_types_with_one_name_are_rejected() -> None:
    class Other(msgspec.Struct):
        __message_type_name__ = "Shipping.Messages.ShipOrder"

    types = MessageTypes()
    types.add(ShipOrder)
    with pytest.raises(ConfigurationError, match="used by both"):
        types.add(Other)


def test_undecodable_body_keeps_raw_bytes_and_cause() -> None:
    types = MessageTypes()
    types.add(PlaceOrder)
    with pytest.raises(MessageDecodeError) as info:
        types.decode(PlaceOrder, b'{"order_id": 5}')
    assert info.value.body == b'{"order_id": 5}'
    assert isinstance(info.value.__cause__, msgspec.DecodeError)


def test_outgoing_message_has_standard_headers() -> None:
    outgoing = create_outgoing(PlaceOrder("1"), originating_endpoint="web", reply_to="web",
                               time_to_be_received=timedelta(days=1, seconds=1.5))
    headers = outgoing.headers
    assert headers[Headers.MESSAGE_ID] == outgoing.message_id
    assert headers[Headers.CONVERSATION_ID] == outgoing.message_id
    assert headers[Headers.ENCLOSED_MESSAGE_TYPES] == f"{__name__}.PlaceOrder"
    assert headers[Headers.CONTENT_TYPE] == "application/json"
    assert headers[Headers.MESSAGE_INTENT] == "Send"
    assert headers[Headers.TIME_TO_BE_RECEIVED] == "1.00:00:01.5000000"
    assert outgoing.time_to_be_received == 86401.5
    from_wire_time(headers[Headers.TIME_SENT])  # parses


def test_outgoing_rejects_non_structs_and_non_positive_ttbr() -> None:
    with pytest.raises(ConfigurationError):
        create_outgoing({"order_id": "1"})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        create_outgoing(PlaceOrder("1"), time_to_be_received=timedelta(0))
