"""Routes (pure: no database): the lookup, its precedence, and every bad route refused."""

from __future__ import annotations

import msgspec
import pytest

from endpoint_runtime import Endpoint
from endpoint_runtime.chain.routing import RouteTable, type_name
from endpoint_runtime.errors import ConfigurationError, InvalidQueueNameError, RoutingError
from endpoint_runtime.settings import EndpointSettings, load_settings
from endpoint_runtime.testing import TestableHandlerContext
from tests.support.routed_messages import CardCharged, ChargeCard, ShipParcel

MODULE = "tests.support.routed_messages"


class Unrouted(msgspec.Struct):
    n: int


def test_a_type_route_beats_its_module_route_and_a_module_beats_its_package() -> None:
    routes = RouteTable({"tests.support": "support", MODULE: "payments"})
    routes.add(ShipParcel, "shipping")
    assert routes.destination_for(ShipParcel) == "shipping"
    assert routes.destination_for(ChargeCard) == "payments"
    assert routes.destination_for(Unrouted) is None  # tests.unit...: no route covers it
    assert RouteTable({"tests": "all"}).destination_for(Unrouted) == "all"


def test_a_module_route_does_not_cover_a_module_that_only_shares_its_prefix() -> None:
    routes = RouteTable({"tests.support.routed": "wrong"})  # not tests.support.routed_messages
    assert routes.destination_for(ChargeCard) is None


def test_the_lookup_follows_routes_added_later() -> None:
    routes = RouteTable()
    assert routes.destination_for(ChargeCard) is None  # remembered as unrouted...
    routes.add(MODULE, "payments")
    assert routes.destination_for(ChargeCard) == "payments"  # ...until a route is added


def test_the_same_route_twice_is_one_route_and_a_second_destination_is_refused() -> None:
    routes = RouteTable()
    routes.add(ChargeCard, "payments")
    routes.add(type_name(ChargeCard), "payments")  # by name: the same key, the same queue
    assert routes.items() == [(type_name(ChargeCard), "payments")]
    with pytest.raises(ConfigurationError, match=r"two routes for .*ChargeCard.*'payments'.*"
                                                  r"'billing'"):
        routes.add(ChargeCard, "billing")


@pytest.mark.parametrize("destination", ["", "x" * 200, "a.b.c", "bad\x00name"])
def test_a_route_to_an_invalid_queue_name_is_refused(destination: str) -> None:
    with pytest.raises(InvalidQueueNameError, match=r"^the route for .*ChargeCard: "):
        RouteTable().add(ChargeCard, destination)


@pytest.mark.parametrize("key", ["", "not a module", "a..b", "1abc", 42])
def test_a_route_for_something_that_is_not_a_type_or_module_name_is_refused(key: object) -> None:
    with pytest.raises(ConfigurationError, match="message type or a module"):
        RouteTable().add(key, "payments")  # type: ignore[arg-type]


def test_an_event_cannot_be_routed_it_is_published() -> None:
    with pytest.raises(ConfigurationError, match="is an event"):
        RouteTable().add(CardCharged, "payments")


def test_no_route_raises_a_routing_error_naming_the_type_and_the_line_to_add() -> None:
    with pytest.raises(RoutingError) as raised:
        RouteTable().require(Unrouted)
    text = str(raised.value)
    assert f"no route for {type_name(Unrouted)}" in text
    assert 'endpoint.route(Unrouted, to="<queue>")' in text
    assert "destination=" in text


def test_routes_come_from_the_settings_file_the_environment_and_the_code(tmp_path) -> None:
    path = tmp_path / "settings.toml"
    path.write_text(f'[routes]\n"{MODULE}" = "payments"\n')
    settings = load_settings(EndpointSettings, path=path, environ={
        "ENDPOINT_RUNTIME_ROUTES": f"{type_name(ShipParcel)}=shipping, tests.unit=local"})
    endpoint = Endpoint("orders", settings=settings)
    endpoint.route(Unrouted, to="elsewhere")
    assert dict(endpoint.routes.items()) == {
        type_name(ShipParcel): "shipping", MODULE: "payments",
        type_name(Unrouted): "elsewhere", "tests.unit": "local"}
    assert endpoint.sender.routes is endpoint.routes  # the endpoint's sender routes alike


def test_a_malformed_routes_variable_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"ENDPOINT_RUNTIME_ROUTES.*key=value"):
        load_settings(EndpointSettings, environ={"ENDPOINT_RUNTIME_ROUTES": "payments"})


def test_a_bad_route_in_the_settings_fails_the_endpoint_at_construction() -> None:
    with pytest.raises(InvalidQueueNameError,
                       match=f"^the route for {MODULE}: queue address 'a.b.c' has more than"):
        Endpoint("orders", routes={MODULE: "a.b.c"})


async def test_a_handler_sends_by_route_under_the_testing_context() -> None:
    endpoint = Endpoint("orders")
    endpoint.route(MODULE, to="payments")
    context = TestableHandlerContext(endpoint=endpoint)
    await context.send(ChargeCard(1))
    await context.send(ShipParcel(2), destination="override")  # an explicit queue wins
    assert [(r.message, r.destination) for r in context.sent] == [
        (ChargeCard(1), "payments"), (ShipParcel(2), "override")]
    with pytest.raises(RoutingError):
        await context.send(Unrouted(3))
    assert len(context.sent) == 2  # nothing recorded for the failed send
