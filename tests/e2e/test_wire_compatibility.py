"""Commands and events through a deployed endpoint (in process, PostgreSQL): subscriptions at start
are events (and plain messages) only, stored command subscriptions are pruned, a handler's
publish of a command is refused, and a published event carries the incoming CorrelationId."""

from __future__ import annotations

import pytest

from endpoint_runtime import Headers, QueueAddress, Sender
from endpoint_runtime.chain.subscriptions import SubscriptionStore, topics_of
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.wire.messages import ErrorHeaders, decode_headers
from tests.e2e.conftest import Deployer, count, wait_for
from tests.support.kinds_endpoints import OrderNote, OrderPlaced, PlaceOrder

pytestmark = pytest.mark.in_process

MODULE = "tests.support.kinds_endpoints"


async def test_an_endpoint_subscribes_to_events_only_and_prunes_its_command_subscriptions(
    deployer: Deployer, transport: PostgresTransport, sender: Sender,
) -> None:
    await transport.pool.execute(
        "CREATE TABLE kinds_seen (order_id text, type_name text, correlation_id text, "
        "related_to text)")
    store = SubscriptionStore(QueueAddress("SubscriptionRouting"))
    async with transport.pool.acquire() as connection:
        await store.setup(connection)
    command_topic = topics_of(PlaceOrder)[0]
    # As a version that subscribed to every handled type left it, beside another endpoint's.
    await store.subscribe(transport.pool, QueueAddress("kinds_orders"), "kinds_orders",
                          command_topic)
    await store.subscribe(transport.pool, QueueAddress("other"), "other", command_topic)

    await deployer.start("orders", module=MODULE)

    rows = await transport.pool.fetch(
        'SELECT endpoint, topic FROM "SubscriptionRouting" ORDER BY 1, 2')
    assert [tuple(row) for row in rows] == [
        ("kinds_orders", topics_of(OrderNote)[0]),
        ("kinds_orders", topics_of(OrderPlaced)[0]),
        ("other", command_topic),  # not this endpoint's: left alone
    ]

    placed_id = await sender.send(PlaceOrder("o-1"), destination="kinds_orders",
                                  headers={Headers.CORRELATION_ID: "corr-e2e"})
    refused_id = await sender.send(PlaceOrder("o-2", publish_itself=True),
                                   destination="kinds_orders")

    async def settled() -> bool:
        return (await count(transport.pool, "SELECT count(*) FROM kinds_seen") >= 1
                and await transport.depth("error") >= 1)

    await wait_for(settled, timeout=30, what="the event handled and the refused publish failed")

    seen = await transport.pool.fetch("SELECT * FROM kinds_seen")
    # o-2's event rolled back with the refused publish (atomic mode): only o-1's is seen.
    assert [tuple(row) for row in seen] == [("o-1", "OrderPlaced", "corr-e2e", placed_id)]
    [failed] = [decode_headers(row["headers"])
                for row in await transport.pool.fetch("SELECT headers FROM error")]
    assert failed[Headers.MESSAGE_ID] == refused_id
    assert failed[ErrorHeaders.EXCEPTION_TYPE].endswith(ConfigurationError.__name__)
    assert "cannot publish" in failed[ErrorHeaders.MESSAGE]
