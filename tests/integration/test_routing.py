"""Routing against a real PostgreSQL, in every transaction mode, without Ray: a handler's send
without a destination goes to its type's route, an explicit destination wins, and a send with
no route fails the message like any handler failure (retries, then the error queue). A
sender outside handlers routes alike, and a deployment's start names routes whose queues do
not exist."""

from __future__ import annotations

import msgspec
import pytest
import structlog

from endpoint_runtime import Endpoint, HandlerContext, Sender, TransportSettings
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import RoutingError
from endpoint_runtime.runtime.deployment import prepare_endpoint
from endpoint_runtime.settings import replace as replace_settings
from endpoint_runtime.wire.messages import ErrorHeaders
from tests.support.draining import drain, received_all
from tests.support.modes import MODES
from tests.support.routed_messages import ChargeCard, ShipParcel

ROUTED = "tests.support.routed_messages"


class Order(msgspec.Struct):
    n: int


class Unrouted(msgspec.Struct):
    n: int


def orders_in(mode: str) -> Endpoint:
    """``orders`` in ``mode``, one immediate retry where the mode retries, the module of
    routed messages routed to ``payments``."""
    retries = {} if mode == "none" else {"immediate_retries": 1, "delayed_retries": 0}
    endpoint = Endpoint("orders", **MODES[mode], **retries)
    endpoint.route(ROUTED, to="payments")
    return endpoint


async def orders_handled(transport: PostgresTransport, endpoint: Endpoint,
                         mode: str) -> list[int]:
    """Orders 1, 2 and 3 sent and handled (message 2 fails in every handler here); the
    orders whose sends a failed attempt left behind ("ghosts" in receive-only and none)."""
    await prepare(transport, endpoint)
    for n in (1, 2, 3):
        await transport.send("orders", create_outgoing(Order(n)))
    await drain(transport, endpoint)
    return {"receive_only": [2, 2], "none": [2]}.get(mode, [])


def routed_endpoint(mode: str) -> Endpoint:
    endpoint = orders_in(mode)  # the whole module to payments...
    endpoint.route(ShipParcel, to="shipping")  # ...but this type elsewhere

    @endpoint.handler
    async def place(message: Order, context: HandlerContext) -> None:
        await context.send(ChargeCard(message.n))
        await context.send(ShipParcel(message.n))
        await context.send(ChargeCard(-message.n), destination="audit_payments")
        if message.n == 2:
            await context.send(Unrouted(message.n))

    return endpoint


async def prepare(transport: PostgresTransport, endpoint: Endpoint) -> None:
    for queue in ("orders", "payments", "shipping", "audit_payments", "error"):
        await transport.create_queue(queue)
    if endpoint.settings.outbox is not None:
        async with transport.pool.acquire() as connection:
            await OutboxStorage.for_settings(endpoint.address, endpoint.settings).setup(connection)


async def ns(transport: PostgresTransport, queue: str) -> list[int]:
    return sorted(msgspec.json.decode(m.body, type=ChargeCard).n
                  for m in await received_all(transport, queue))


@pytest.mark.parametrize("mode", MODES)
async def test_handlers_send_by_route_and_an_unrouted_send_fails_to_the_error_queue(
    transport: PostgresTransport, mode: str,
) -> None:
    # Receive-only and none send at once: each failed attempt of message 2 left its routed
    # sends behind (docs/guarantees.md, "ghosts"); the other modes roll them back.
    ghosts = await orders_handled(transport, routed_endpoint(mode), mode)
    assert await ns(transport, "payments") == sorted([1, 3, *ghosts])
    assert await ns(transport, "shipping") == sorted([1, 3, *ghosts])
    assert await ns(transport, "audit_payments") == sorted([-3, -1, *(-n for n in ghosts)])
    failed = await received_all(transport, "error")
    assert [(msgspec.json.decode(m.body, type=Order).n, m.headers[ErrorHeaders.EXCEPTION_TYPE])
            for m in failed] == [(2, "endpoint_runtime.errors.RoutingError")]
    assert "no route for tests.integration.test_routing.Unrouted" in failed[0].headers[
        ErrorHeaders.MESSAGE]
    assert await transport.depth("orders") == 0


async def test_a_sender_and_an_endpoint_send_by_route(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    for queue in ("payments", "shipping"):
        await transport.create_queue(queue)
    settings = TransportSettings(dsn=database_dsn)
    async with Sender("web", settings, routes={ROUTED: "payments"}) as sender:
        await sender.send(ChargeCard(1))
        await sender.send(ChargeCard(2), "shipping")  # positional destination still wins
        with pytest.raises(RoutingError, match=r"no route for .*Unrouted"):
            await sender.send(Unrouted(3))
    async with Endpoint("web", send_only=True, transport=settings) as endpoint:
        endpoint.route(ChargeCard, to="payments")
        await endpoint.send(ChargeCard(4))
    assert await ns(transport, "payments") == [1, 4]
    assert await ns(transport, "shipping") == [2]


async def test_a_deployment_start_names_the_routes_whose_queues_do_not_exist(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    await transport.create_queue("payments")
    endpoint = Endpoint("orders")
    endpoint.route(ChargeCard, to="payments")
    endpoint.route(ShipParcel, to="shipping")  # not created

    @endpoint.handler
    async def place(message: Order, context: HandlerContext) -> None:
        await context.send(ChargeCard(message.n))

    settings = replace_settings(endpoint.settings, transport=TransportSettings(dsn=database_dsn))
    with structlog.testing.capture_logs() as logs:
        await prepare_endpoint(endpoint, settings)
    warnings = [entry for entry in logs if entry["event"] == "routes_to_missing_queues"]
    assert [entry["routes"] for entry in warnings] == [
        {"tests.support.routed_messages.ShipParcel": "shipping"}]
    await transport.create_queue("shipping")
    with structlog.testing.capture_logs() as logs:
        await prepare_endpoint(endpoint, settings)
    assert not [entry for entry in logs if entry["event"] == "routes_to_missing_queues"]


def returning_endpoint(mode: str) -> Endpoint:
    endpoint = orders_in(mode)

    @endpoint.handler
    async def place(message: Order) -> list[msgspec.Struct]:  # the message alone
        return [ChargeCard(message.n), ChargeCard(-message.n)]

    @endpoint.handler(message_type=Order)
    async def check(message: Order, context: HandlerContext) -> None:
        if message.n == 2:  # fails after the first handler's messages were cascaded
            raise RuntimeError("declined")

    return endpoint


@pytest.mark.parametrize("mode", MODES)
async def test_returned_messages_go_by_route_inside_the_messages_transaction(
    transport: PostgresTransport, mode: str,
) -> None:
    # As sends from the handler: they commit with the receive, or, in receive-only and none,
    # leave at once (each failed attempt's stay sent).
    ghosts = await orders_handled(transport, returning_endpoint(mode), mode)
    expected = sorted([1, 3, *ghosts] + [-n for n in (1, 3, *ghosts)])
    assert await ns(transport, "payments") == expected
    [failed] = await received_all(transport, "error")
    assert msgspec.json.decode(failed.body, type=Order) == Order(2)
