"""Publish/subscribe and audit against a real PostgreSQL, driven through each mode's receive
strategy (no Ray): fan-out, polymorphic delivery, the transaction guarantees of a publish, the
subscriber cache, NServiceBus-format events both ways, audit copies with processing headers."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from endpoint_runtime import Endpoint, Sender, TransportSettings
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.subscriptions import (
    SubscriptionStore,
    subscribe_to_handled_types,
    topics_of,
)
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import Headers, MessageIntent, from_wire_time
from tests.support import pubsub_endpoints
from tests.support.draining import drain, received_all
from tests.support.pubsub_endpoints import (
    PUBLISHERS,
    OrderPlaced,
    PlaceOrder,
    PriorityOrderPlaced,
    ShipmentBooked,
    analytics,
    billing,
)

SUBSCRIBERS = (billing, analytics)


async def prepare(transport: PostgresTransport, *endpoints: Endpoint) -> None:
    for queue in ("error", "audit", *(e.name for e in (*endpoints, *SUBSCRIBERS))):
        await transport.create_queue(queue)
    await transport.pool.execute(
        "CREATE TABLE IF NOT EXISTS placed (order_id text);"
        "CREATE TABLE IF NOT EXISTS seen (endpoint text, order_id text, type_name text)")
    async with transport.pool.acquire() as connection:
        for endpoint in endpoints:
            assert endpoint.delayed_store is not None
            await endpoint.delayed_store.setup_infrastructure(connection)
            if endpoint.settings.outbox is not None:
                await OutboxStorage.for_settings(endpoint.address, endpoint.settings).setup(
                    connection)
        for endpoint in SUBSCRIBERS:
            await subscribe_to_handled_types(connection, endpoint.subscriptions, endpoint.name,
                                             endpoint.address, endpoint.registry.handled_types)


async def seen(transport: PostgresTransport) -> list[tuple[str, str, str]]:
    rows = await transport.pool.fetch(
        "SELECT endpoint, order_id, type_name FROM seen ORDER BY 1, 2")
    return [tuple(row) for row in rows]  # type: ignore[misc]


@pytest.mark.parametrize("name", PUBLISHERS)
async def test_a_published_event_reaches_every_subscriber_once_with_the_publish_intent(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher, *SUBSCRIBERS)
    await transport.send(publisher.name, create_outgoing(PlaceOrder("o-1")))

    await drain(transport, publisher)

    for subscriber in SUBSCRIBERS:
        [event] = await received_all(transport, subscriber.name)
        assert event.headers[Headers.MESSAGE_INTENT] == MessageIntent.PUBLISH
        assert event.headers[Headers.ORIGINATING_ENDPOINT] == publisher.name
        assert msgspec.json.decode(event.body, type=OrderPlaced) == OrderPlaced("o-1")


async def test_a_subscriber_to_a_base_type_receives_derived_events_as_the_base_type(
    transport: PostgresTransport,
) -> None:
    publisher = pubsub_endpoints.atomic
    await prepare(transport, publisher, *SUBSCRIBERS)
    await transport.send(publisher.name, create_outgoing(PlaceOrder("priority-1")))
    await drain(transport, publisher)

    headers = msgspec.json.decode(await transport.pool.fetchval("SELECT headers FROM billing_sub"))
    assert headers[Headers.ENCLOSED_MESSAGE_TYPES] == ";".join(topics_of(PriorityOrderPlaced))
    await drain(transport, billing)
    assert await seen(transport) == [("billing_sub", "priority-1", "OrderPlaced")]


@pytest.mark.parametrize("name", ["atomic", "batched", "with_outbox"])
async def test_a_failed_handler_publishes_nothing_in_atomic_and_outbox_modes(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher, *SUBSCRIBERS)
    await transport.send(publisher.name, create_outgoing(PlaceOrder("o-2", fail=True)))

    await drain(transport, publisher)

    assert await transport.depth("error") == 1
    assert [await transport.depth(s.name) for s in SUBSCRIBERS] == [0, 0]
    assert await transport.depth("audit") == 0


async def test_the_outbox_publishes_once_however_often_the_message_comes(
    transport: PostgresTransport,
) -> None:
    publisher = pubsub_endpoints.with_outbox
    await prepare(transport, publisher, *SUBSCRIBERS)
    message_id = str(uuid.uuid4())
    for _ in range(3):
        await transport.send(publisher.name, create_outgoing(
            PlaceOrder("o-3"), headers={Headers.MESSAGE_ID: message_id}))

    await drain(transport, publisher)

    assert await transport.pool.fetchval("SELECT count(*) FROM placed") == 1
    assert [await transport.depth(s.name) for s in SUBSCRIBERS] == [1, 1]


async def test_a_publish_without_subscribers_is_not_an_error(
    transport: PostgresTransport,
) -> None:
    publisher = pubsub_endpoints.atomic
    await prepare(transport, publisher)
    await transport.pool.execute('DELETE FROM "SubscriptionRouting"')
    await transport.send(publisher.name, create_outgoing(PlaceOrder("o-4")))

    await drain(transport, publisher)

    assert await transport.pool.fetchval("SELECT count(*) FROM placed") == 1
    assert await transport.depth("error") == 0


async def test_nservicebus_format_events_come_in_and_go_out(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    await prepare(transport, *SUBSCRIBERS)
    # In: a .NET publisher's row, its type assembly-qualified, the hierarchy after it.
    await transport.pool.execute(
        "INSERT INTO public.billing_sub (id, headers, body) VALUES ($1, $2, $3)",
        uuid.uuid4(),
        msgspec.json.encode({
            Headers.MESSAGE_ID: str(uuid.uuid4()),
            Headers.ENCLOSED_MESSAGE_TYPES:
                "Shipping.Messages.Events.ShipmentBooked, Shipping.Messages, Version=1.0.0.0, "
                "Culture=neutral, PublicKeyToken=null;NServiceBus.IEvent, NServiceBus.Core",
            Headers.MESSAGE_INTENT: "Publish",
        }).decode(),
        b'{"ShipmentId":"s-1"}',
    )
    await drain(transport, billing)
    assert await seen(transport) == [("billing_sub", "s-1", "ShipmentBooked")]

    # Out: a .NET subscriber's row in the subscription table (its topic, its queue address).
    await transport.create_queue("shipping_tracker")
    await transport.pool.execute(
        'INSERT INTO "SubscriptionRouting" (queueaddress, endpoint, topic) '
        "VALUES ('shipping_tracker', 'Shipping.Tracker', $1)",
        "Shipping.Messages.Events.ShipmentBooked")
    async with Sender("shipping", TransportSettings(dsn=database_dsn)) as sender:
        await sender.publish(ShipmentBooked("s-2"))
    [event] = await received_all(transport, "shipping_tracker")
    assert event.headers[Headers.ENCLOSED_MESSAGE_TYPES] == \
        "Shipping.Messages.Events.ShipmentBooked"
    assert event.body == b'{"ShipmentId":"s-2"}'


async def test_subscriber_lists_are_cached_and_a_local_change_drops_the_cache(
    transport: PostgresTransport,
) -> None:
    await prepare(transport)
    store = SubscriptionStore(QueueAddress("SubscriptionRouting"), cache_seconds=3600)
    topics = topics_of(OrderPlaced)
    first = await store.subscribers(transport.pool, topics)
    assert sorted(str(a) for a in first) == ["public.analytics_sub", "public.billing_sub"]

    await transport.pool.execute("DELETE FROM \"SubscriptionRouting\" WHERE endpoint = $1",
                                 "analytics_sub")  # elsewhere: this process keeps its list
    assert await store.subscribers(transport.pool, topics) == first
    assert await store.unsubscribe(transport.pool, "billing_sub", topics[0])  # here: dropped
    assert await store.subscribers(transport.pool, topics) == []


@pytest.mark.parametrize("name", PUBLISHERS)
async def test_an_audit_copy_carries_the_original_headers_and_the_processing_headers(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher)
    sent = create_outgoing(PlaceOrder("o-5"), headers={"x-custom": "kept"})
    await transport.send(publisher.name, sent)

    await drain(transport, publisher)

    [audited] = await received_all(transport, "audit")
    assert audited.body == sent.body
    assert audited.native_id != uuid.UUID(sent.message_id)  # a row id of its own
    headers = audited.headers
    assert {k: headers[k] for k in sent.headers} == sent.headers
    assert headers[Headers.PROCESSING_ENDPOINT] == publisher.name
    assert headers[Headers.PROCESSING_MACHINE]
    started = from_wire_time(headers[Headers.PROCESSING_STARTED])
    ended = from_wire_time(headers[Headers.PROCESSING_ENDED])
    assert from_wire_time(headers[Headers.TIME_SENT]) <= started <= ended
