"""Wire compatibility with NServiceBus against a real PostgreSQL, through each mode's receive
strategy (no Ray; black-box: messages in, rows out): the CorrelationId of what handlers send,
publish and reply; wire names of subclasses of named types; publishing commands refused."""

from __future__ import annotations

import asyncpg
import msgspec
import pytest

from endpoint_runtime import ConfigurationError, Endpoint, HandlerContext, Sender, TransportSettings
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.subscriptions import SubscriptionStore, topics_of
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import install as install_tables
from endpoint_runtime.database.privileges import endpoint_grants
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import Headers, MessageIntent
from endpoint_runtime.wire.serialization import message_type_name
from tests.support.draining import drain, received_all
from tests.support.kinds_endpoints import (
    Announced,
    Answer,
    Forward,
    Forwarded,
    OrderNote,
    OrderPlaced,
    PlaceOrder,
    correlators,
    orders,
)
from tests.support.roles import login_role


async def install(transport: PostgresTransport, endpoint: Endpoint, *queues: str) -> None:
    for queue in (endpoint.name, "error", *queues):
        await transport.create_queue(queue)
    async with transport.pool.acquire() as connection:
        assert endpoint.delayed_store is not None
        await endpoint.delayed_store.setup_infrastructure(connection)
        if endpoint.settings.outbox is not None:
            await OutboxStorage.for_settings(endpoint.address, endpoint.settings).setup(
                connection)
        await endpoint.subscriptions.setup(connection)


@pytest.mark.parametrize("mode", list(correlators))
async def test_sends_publishes_and_replies_of_a_handler_carry_the_incoming_correlation_id(
    transport: PostgresTransport, mode: str,
) -> None:
    """NServiceBus copies the incoming CorrelationId onto every outgoing message of a handler
    (else the incoming message id); before, sends and publishes carried their own id."""
    endpoint = correlators[mode]
    await install(transport, endpoint, "forwarded", "listener", "client")
    await endpoint.subscriptions.subscribe(transport.pool, QueueAddress("listener"), "listener",
                                           topics_of(Announced)[0])
    correlated = create_outgoing(Forward("a"), reply_to="client",
                                 headers={Headers.CORRELATION_ID: "corr-7"})
    plain = create_outgoing(Forward("b"), reply_to="client")
    foreign = create_outgoing(Forward("c"), reply_to="client")
    del foreign.headers[Headers.CORRELATION_ID]  # a peer that sets none
    for message in (correlated, plain, foreign):
        await transport.send(endpoint.name, message)

    await drain(transport, endpoint)

    expected = {correlated.message_id: "corr-7", plain.message_id: plain.message_id,
                foreign.message_id: foreign.message_id}
    for queue, intent, body_type in (("forwarded", MessageIntent.SEND, Forwarded),
                                     ("listener", MessageIntent.PUBLISH, Announced),
                                     ("client", MessageIntent.REPLY, Answer)):
        out = await received_all(transport, queue)
        assert len(out) == 3, queue
        for message in out:
            assert message.headers[Headers.MESSAGE_INTENT] == intent
            assert isinstance(msgspec.json.decode(message.body, type=body_type), body_type)
        by_request = {m.headers[Headers.RELATED_TO]: m.headers[Headers.CORRELATION_ID]
                      for m in out}
        assert by_request == expected, queue
        assert all(m.headers[Headers.CORRELATION_ID] != m.message_id for m in out), queue
    assert await transport.depth("error") == 0


async def test_sends_from_outside_a_handler_start_a_correlation_with_their_own_id(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    await transport.create_queue("forwarded")
    async with Sender("web", TransportSettings(dsn=database_dsn)) as sender:
        message_id = await sender.send(Forwarded("x"), destination="forwarded")
    [message] = await received_all(transport, "forwarded")
    assert message.headers[Headers.CORRELATION_ID] == message_id


# -- a subclass of a named type: its own wire name and topic ------------------------------

class OrderEvent(msgspec.Struct):
    __message_type_name__ = "Shop.Events.OrderEvent"
    order: str


class RushOrderEvent(OrderEvent):
    """Sets no name: before the fix it took "Shop.Events.OrderEvent" and collided."""

    rush: bool = True


def recorder(name: str, *types: type[msgspec.Struct]) -> Endpoint:
    endpoint = Endpoint(name, immediate_retries=0, delayed_retries=0)

    async def record(message: msgspec.Struct, context: HandlerContext) -> None:
        await context.connection.execute(
            "INSERT INTO seen (endpoint, order_id, type_name, enclosed) VALUES ($1, $2, $3, $4)",
            name, getattr(message, "order", ""), type(message).__name__,
            context.headers[Headers.ENCLOSED_MESSAGE_TYPES])

    for message_type in types:
        endpoint.register(record, message_type)
    return endpoint


async def test_a_named_event_and_its_unnamed_subclass_are_published_and_handled_apart(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    both = recorder("sub_both", OrderEvent, RushOrderEvent)  # before: "used by both"
    base_only = recorder("sub_base", OrderEvent)
    await transport.pool.execute(
        "CREATE TABLE seen (endpoint text, order_id text, type_name text, enclosed text)")
    for endpoint in (both, base_only):
        await install(transport, endpoint)
        async with transport.pool.acquire() as connection:
            await endpoint.subscribe_at_start(connection, endpoint.subscriptions)
    rush_name = f"{__name__}.RushOrderEvent"
    assert message_type_name(RushOrderEvent) == rush_name
    rows = await transport.pool.fetch(
        'SELECT endpoint, topic FROM "SubscriptionRouting" ORDER BY 1, 2')
    assert [tuple(row) for row in rows] == [
        ("sub_base", "Shop.Events.OrderEvent"),
        ("sub_both", "Shop.Events.OrderEvent"), ("sub_both", rush_name)]

    async with Sender("shop", TransportSettings(dsn=database_dsn)) as sender:
        await sender.publish(RushOrderEvent("r-1"))
        await sender.publish(OrderEvent("o-1"))
    for endpoint in (both, base_only):
        await drain(transport, endpoint)

    seen = await transport.pool.fetch("SELECT * FROM seen ORDER BY 1, 2")
    rush_enclosed = f"{rush_name};Shop.Events.OrderEvent"
    assert [tuple(row) for row in seen] == [
        ("sub_base", "o-1", "OrderEvent", "Shop.Events.OrderEvent"),
        ("sub_base", "r-1", "OrderEvent", rush_enclosed),  # decoded as the base it knows
        ("sub_both", "o-1", "OrderEvent", "Shop.Events.OrderEvent"),
        ("sub_both", "r-1", "RushOrderEvent", rush_enclosed),  # one copy, as its own type
    ]
    assert await transport.depth("error") == 0


# -- commands are not published ---------------------------------------------------------

async def test_a_sender_refuses_to_publish_a_command_even_to_a_stored_subscription(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    await transport.create_queue("stale")
    store = SubscriptionStore(QueueAddress("SubscriptionRouting"))
    async with transport.pool.acquire() as connection:
        await store.setup(connection)
    await store.subscribe(transport.pool, QueueAddress("stale"), "stale", topics_of(PlaceOrder)[0])

    async with Sender("shop", TransportSettings(dsn=database_dsn)) as sender:
        with pytest.raises(ConfigurationError, match=r"cannot publish .*PlaceOrder.*command"):
            await sender.publish(PlaceOrder("p-1"))
        await sender.send(PlaceOrder("p-2"), destination="stale")  # sending it is fine
    [sent] = await received_all(transport, "stale")
    assert msgspec.json.decode(sent.body, type=PlaceOrder) == PlaceOrder("p-2")


async def test_subscribing_at_start_writes_no_command_subscription(
    transport: PostgresTransport,
) -> None:
    """Events and plain messages only: nothing to prune on a fresh table means the command
    was never subscribed to (not subscribed, then deleted)."""
    endpoint = Endpoint("kinds_fresh", immediate_retries=0, delayed_retries=0)

    async def handle(message: msgspec.Struct, context: HandlerContext) -> None:
        pass

    for message_type in (PlaceOrder, Announced, Answer):
        endpoint.register(handle, message_type)
    await install(transport, endpoint)
    async with transport.pool.acquire() as connection:
        pruned = await endpoint.subscribe_at_start(connection, endpoint.subscriptions)
    assert pruned == []
    rows = await transport.pool.fetch('SELECT topic FROM "SubscriptionRouting" ORDER BY 1')
    assert [row[0] for row in rows] == sorted([topics_of(Announced)[0], topics_of(Answer)[0]])


async def test_an_endpoint_role_with_its_grants_alone_prunes_its_own_command_subscription(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    """What a deployment without installers does at start, as the role ``db grants`` made
    (row-level security on the subscription table): its own stored command subscription goes,
    another endpoint's stays, its events are subscribed to."""
    endpoint = orders
    await install_tables(transport, endpoint, endpoint.settings)
    store = endpoint.subscriptions
    command_topic = topics_of(PlaceOrder)[0]
    await store.subscribe(transport.pool, endpoint.address, endpoint.name, command_topic)
    await store.subscribe(transport.pool, QueueAddress("other"), "other", command_topic)
    async with login_role(database_dsn) as role:
        database = await transport.pool.fetchval("SELECT current_database()")
        await transport.pool.execute("\n".join(
            endpoint_grants(endpoint, endpoint.settings, role.name, database=database)))
        connection = await asyncpg.connect(role.dsn)
        try:
            pruned = await endpoint.subscribe_at_start(connection, store)
            # Row-level security in force: another endpoint's rows are out of its reach.
            assert await connection.execute(
                'DELETE FROM "SubscriptionRouting" WHERE endpoint = $1', "other") == "DELETE 0"
        finally:
            await connection.close()
    assert pruned == [command_topic]
    rows = await transport.pool.fetch(
        'SELECT endpoint, topic FROM "SubscriptionRouting" ORDER BY 1, 2')
    assert [tuple(row) for row in rows] == [
        (endpoint.name, topics_of(OrderNote)[0]), (endpoint.name, topics_of(OrderPlaced)[0]),
        ("other", command_topic)]
