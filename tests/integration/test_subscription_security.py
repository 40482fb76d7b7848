"""The subscription table under least-privilege roles, against a real PostgreSQL: with what
``db grants`` prints (``endpoint_grants``) an endpoint's role reads every subscription but
changes only its own endpoint's; an NServiceBus endpoint's role, given the same row-level
security for its endpoint name (``subscription_policies``), keeps upserting and deleting its
rows with NServiceBus's own statements; a publisher that does not subscribe may read the
table; a queue the role may not use is refused (42501), never taken for a missing one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import msgspec
import pytest

from endpoint_runtime import Endpoint, Sender, TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.chain.subscriptions import (
    dangling_subscriptions,
    prune_dangling,
    subscribe_to_handled_types,
    subscription_store,
    topics_of,
)
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import install
from endpoint_runtime.database.privileges import endpoint_grants, subscription_policies
from endpoint_runtime.transport import QueueAddress
from tests.integration.test_publish_missing_queues import drain
from tests.support import pubsub_endpoints
from tests.support.draining import received_all
from tests.support.pubsub_endpoints import OrderPlaced, PlaceOrder, ShipmentBooked, billing
from tests.support.roles import Role, login_role

TOPIC = topics_of(OrderPlaced)[0]
TABLE = '"SubscriptionRouting"'
web = Endpoint("web_publisher", send_only=True, auto_subscribe=False)
"""Publishes from outside handlers and subscribes to nothing."""


@pytest.fixture
async def role(database_dsn: str) -> AsyncIterator[Role]:
    async with login_role(database_dsn) as made:
        yield made


@pytest.fixture
async def other_role(database_dsn: str) -> AsyncIterator[Role]:
    async with login_role(database_dsn) as made:
        yield made


async def apply(transport: PostgresTransport, statements: list[str]) -> None:
    """As the administrator (the tables' owner), on one connection: the policies come in a
    transaction of their own."""
    async with transport.pool.acquire() as connection:
        for statement in statements:
            await connection.execute(statement)


async def grant_endpoint(transport: PostgresTransport, endpoint: Endpoint, role: Role,
                         sends_to: tuple[str, ...] = ()) -> None:
    await install(transport, endpoint, endpoint.settings)
    await apply(transport, endpoint_grants(endpoint, endpoint.settings, role.name,
                                           sends_to=sends_to))


async def rows(transport: PostgresTransport) -> set[tuple[str, str, str]]:
    found = await transport.pool.fetch(f"SELECT endpoint, topic, queueaddress FROM {TABLE}")
    return {(row[0], row[1], row[2]) for row in found}


async def test_an_endpoint_role_changes_only_its_own_subscriptions(
    transport: PostgresTransport, role: Role,
) -> None:
    for queue in ("sales", "error"):
        await transport.create_queue(queue)
    await grant_endpoint(transport, billing, role)
    await transport.pool.execute(
        f"INSERT INTO {TABLE} (queueaddress, endpoint, topic) VALUES ('sales', 'sales', $1)",
        TOPIC)
    store = subscription_store(billing.settings.transport)

    connection = await asyncpg.connect(role.dsn)
    try:
        # Its own: subscribe (insert, then the upsert's update), unsubscribe.
        await subscribe_to_handled_types(connection, store, billing.name, billing.address,
                                         billing.registry.handled_types, install=False)
        await subscribe_to_handled_types(connection, store, billing.name, billing.address,
                                         billing.registry.handled_types, install=False)
        assert await store.unsubscribe(connection, billing.name, topics_of(ShipmentBooked)[0])
        # Everyone's: read, as a publish does.
        assert QueueAddress("sales") in await store.subscribers(connection, (TOPIC,))
        # Not another endpoint's: no redirect by upsert, update or insert; no delete.
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            await store.subscribe(connection, billing.address, "sales", TOPIC)
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            await store.subscribe(connection, billing.address, "sales", "other.Topic")
        assert await connection.execute(
            f"UPDATE {TABLE} SET queueaddress = 'billing_sub' WHERE endpoint = 'sales'"
        ) == "UPDATE 0"
        assert not await store.unsubscribe(connection, "sales", TOPIC)
        # Prune: only its own row that points nowhere goes; another endpoint's stays.
        await transport.pool.execute(
            f"INSERT INTO {TABLE} (queueaddress, endpoint, topic) VALUES ('gone', 'gone', $1),"
            f" ('gone', $2, 'gone.Topic')", TOPIC, billing.name)
        dangling = await dangling_subscriptions(connection, store)
        assert {d.subscription.endpoint for d in dangling} == {"gone", billing.name}
        [pruned] = await prune_dangling(connection, store, dangling)
        assert pruned.endpoint == billing.name
        assert await connection.execute(f"DELETE FROM {TABLE}") == "DELETE 1"  # its own only
    finally:
        await connection.close()

    assert await rows(transport) == {("sales", TOPIC, "sales"), ("gone", TOPIC, "gone")}
    # The table's owner (here a superuser) is not bound by row-level security.
    assert await store.unsubscribe(transport.pool, "sales", TOPIC)


async def test_an_nservicebus_endpoint_role_keeps_its_subscriptions_with_its_own_statements(
    transport: PostgresTransport, role: Role, other_role: Role, database_dsn: str,
) -> None:
    await transport.create_queue("shipping_tracker")
    await grant_endpoint(transport, billing, other_role)  # row-level security is on
    dotnet = "Shipping.Tracker"
    topic = ShipmentBooked.__message_type_name__
    await apply(transport, [
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO "{role.name}";',
        *subscription_policies(QueueAddress("SubscriptionRouting"), role.name, dotnet),
    ])
    # The statements of NServiceBus's PostgreSQL transport (unquoted, mixed-case names).
    subscribe = (f"INSERT INTO {TABLE} (QueueAddress, Topic, Endpoint) VALUES ($1, $2, $3) "
                 "ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = $1")
    unsubscribe = f"DELETE FROM {TABLE} WHERE Endpoint = $1 AND Topic = $2"

    connection = await asyncpg.connect(role.dsn)
    try:
        await connection.execute(subscribe, "old_queue", topic, dotnet)
        await connection.execute(subscribe, "shipping_tracker", topic, dotnet)  # the update
        async with Sender("shipping", TransportSettings(dsn=database_dsn)) as sender:
            await sender.publish(ShipmentBooked("s-1"))
        [event] = await received_all(transport, "shipping_tracker")
        assert event.body == b'{"ShipmentId":"s-1"}'
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await connection.execute(subscribe, "shipping_tracker", topic, billing.name)
        assert await connection.execute(unsubscribe, dotnet, topic) == "DELETE 1"
    finally:
        await connection.close()
    assert (dotnet, topic, "shipping_tracker") not in await rows(transport)


async def test_a_publisher_that_does_not_subscribe_may_read_the_subscriptions(
    transport: PostgresTransport, role: Role, other_role: Role,
) -> None:
    await transport.create_queue("error")
    await grant_endpoint(transport, billing, other_role)  # row-level security is on
    await transport.pool.execute(
        f"INSERT INTO {TABLE} (queueaddress, endpoint, topic) VALUES ('billing_sub', $1, $2)",
        billing.name, TOPIC)
    await grant_endpoint(transport, web, role, sends_to=("billing_sub",))

    async with Sender(web.name, TransportSettings(dsn=role.dsn)) as sender:
        await sender.publish(OrderPlaced("o-1"))
    [event] = await received_all(transport, billing.name)
    assert event.body == b'{"order":"o-1"}'


async def test_a_queue_the_role_may_not_use_is_refused_never_taken_for_missing(
    transport: PostgresTransport, role: Role,
) -> None:
    publisher = pubsub_endpoints.atomic
    await transport.pool.execute(
        "CREATE TABLE placed (order_id text); CREATE SCHEMA secret")
    await transport.create_queue("secret.tracker")
    await grant_endpoint(transport, publisher, role, sends_to=("audit",))
    await apply(transport, [f'GRANT INSERT ON placed TO "{role.name}"'])
    await transport.pool.execute(
        f"INSERT INTO {TABLE} (queueaddress, endpoint, topic) "
        "VALUES ('secret.tracker', 'tracker', $1)", TOPIC)
    await transport.send(publisher.name, create_outgoing(PlaceOrder("o-1")))

    async with PostgresTransport.connect(TransportSettings(dsn=role.dsn)) as as_role:
        await drain(as_role, publisher)
        store = subscription_store(publisher.settings.transport)
        assert await dangling_subscriptions(as_role.pool, store) == []
        assert await prune_dangling(as_role.pool, store,
                                    await dangling_subscriptions(as_role.pool, store)) == []

    # The attempt failed on the privilege (42501), as any send to such a queue does: the
    # message is in the error queue, no event copy is, and the subscription stays.
    [failed] = await transport.pool.fetch("SELECT headers FROM error")
    headers = msgspec.json.decode(failed[0])
    assert headers[ErrorHeaders.FAILED_QUEUE] == str(publisher.address)
    assert headers[ErrorHeaders.EXCEPTION_TYPE].endswith("InsufficientPrivilegeError")
    assert await transport.depth("secret.tracker") == 0
    assert ("tracker", TOPIC, "secret.tracker") in await rows(transport)
