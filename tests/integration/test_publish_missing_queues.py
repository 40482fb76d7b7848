"""Publishing when a subscriber's queue table, or the subscription table itself, does not exist,
in every transaction mode, through each mode's receive strategy against a real PostgreSQL:
the other subscribers get the event once, the copy that cannot be delivered waits in the
error queue (retryable once the queue exists), and a missing subscription table is no error.
Also ``Sender.publish``'s checks of the subscriber queues (those of a handler's send)."""

from __future__ import annotations

import msgspec
import pytest
from structlog.testing import capture_logs

from endpoint_runtime import Endpoint, Sender, TransportSettings
from endpoint_runtime.chain.metrics import Metrics
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.error_queue import list_failed, retry_failed
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.chain.subscriptions import topics_of
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import NotAQueueError
from endpoint_runtime.wire.messages import Headers, MessageIntent, TransportMessage
from endpoint_runtime.wire.serialization import message_type_name
from tests.integration.test_publish_subscribe import SUBSCRIBERS, prepare
from tests.support import pubsub_endpoints
from tests.support.draining import received_all
from tests.support.pubsub_endpoints import PUBLISHERS, OrderPlaced, PlaceOrder

GONE = "zz_gone_sub"
"""A subscriber whose queue does not exist; it sorts after the others, so that a publisher
that failed on it would have sent their copies first."""


class RecordedMetrics(Metrics):
    def __init__(self) -> None:
        self.undeliverable: list[str] = []

    def publish_undeliverable(self, message_type: str) -> None:
        self.undeliverable.append(message_type)


async def drain(transport: PostgresTransport, endpoint: Endpoint,
                metrics: Metrics | None = None) -> None:
    """Receive until the endpoint's queue is empty, on one slot."""
    pipeline = endpoint.create_pipeline(metrics=metrics)
    strategy = endpoint.create_strategy(pipeline, transport.pool, endpoint.settings)
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        while (await slot.round()).taken:
            pass
        await slot.close()


async def subscribe_gone(transport: PostgresTransport, queue: str = GONE) -> None:
    await transport.pool.execute(
        'INSERT INTO "SubscriptionRouting" (queueaddress, endpoint, topic) VALUES ($1, $1, $2)',
        queue, topics_of(OrderPlaced)[0])


@pytest.mark.parametrize("name", [*PUBLISHERS, "retrying_receive_only"])
async def test_a_missing_subscriber_queue_blocks_no_other_and_its_copy_waits_in_the_error_queue(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher, *SUBSCRIBERS)
    await subscribe_gone(transport)
    await transport.send(publisher.name, create_outgoing(PlaceOrder("o-1")))
    metrics = RecordedMetrics()

    with capture_logs() as logs:
        await drain(transport, publisher, metrics)

    assert await transport.pool.fetchval("SELECT count(*) FROM placed") == 1  # handled once
    assert await transport.depth(publisher.name) == 0
    events = {}
    for subscriber in SUBSCRIBERS:  # once each: no attempt failed, none was repeated
        [events[subscriber.name]] = await received_all(transport, subscriber.name)
    [failed] = await list_failed(transport)
    assert failed.failed_queue == f"public.{GONE}"
    assert failed.exception_type == "endpoint_runtime.errors.QueueNotFoundError"
    assert GONE in (failed.exception_message or "")
    copy = failed.message
    assert isinstance(copy, TransportMessage)
    event = events["billing_sub"]
    assert copy.body == event.body
    assert msgspec.json.decode(copy.body, type=OrderPlaced) == OrderPlaced("o-1")
    assert copy.headers[Headers.MESSAGE_ID] == event.headers[Headers.MESSAGE_ID]
    assert copy.headers[Headers.MESSAGE_INTENT] == MessageIntent.PUBLISH
    assert copy.headers[Headers.PROCESSING_ENDPOINT] == publisher.name
    assert metrics.undeliverable == [message_type_name(OrderPlaced)]
    [warning] = [e for e in logs if e["event"] == "subscriber_queue_missing"]
    assert warning["log_level"] == "warning"
    assert warning["queue"] == f"public.{GONE}"

    # Once the queue exists, the copy is retried from the error queue like any failure.
    await transport.create_queue(GONE)
    assert await retry_failed(transport, failed.native_id) == f"public.{GONE}"
    [delivered] = await received_all(transport, GONE)
    assert delivered.body == event.body
    assert delivered.headers[Headers.MESSAGE_ID] == event.headers[Headers.MESSAGE_ID]
    assert ErrorHeaders.FAILED_QUEUE not in delivered.headers
    assert await transport.depth("error") == 0


@pytest.mark.parametrize("name", ["atomic", "batched", "with_outbox"])
async def test_a_failed_handler_records_no_copy_for_a_missing_subscriber_in_atomic_modes(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher, *SUBSCRIBERS)
    await subscribe_gone(transport)
    await transport.send(publisher.name, create_outgoing(PlaceOrder("o-2", fail=True)))

    await drain(transport, publisher)

    [failed] = await list_failed(transport)  # the message itself, nothing published
    assert failed.failed_queue == f"public.{publisher.name}"
    assert failed.exception_type == "builtins.RuntimeError"
    assert [await transport.depth(s.name) for s in SUBSCRIBERS] == [0, 0]


@pytest.mark.parametrize("name", PUBLISHERS)
async def test_publishing_without_a_subscription_table_is_no_error(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher)
    await transport.pool.execute('DROP TABLE "SubscriptionRouting"')
    await transport.send(publisher.name, create_outgoing(PlaceOrder("o-3")))

    await drain(transport, publisher)

    assert await transport.pool.fetchval("SELECT count(*) FROM placed") == 1
    assert await transport.depth("error") == 0
    assert await transport.depth(publisher.name) == 0
    assert await transport.depth("audit") == 1  # handled and committed


async def test_a_sender_publish_records_a_missing_subscriber_and_delivers_the_others(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    await prepare(transport)
    await subscribe_gone(transport)
    async with Sender("web", TransportSettings(dsn=database_dsn)) as sender:
        message_id = await sender.publish(OrderPlaced("o-4"))

    for subscriber in SUBSCRIBERS:
        [event] = await received_all(transport, subscriber.name)
        assert event.headers[Headers.MESSAGE_ID] == message_id
    [failed] = await list_failed(transport)
    assert failed.failed_queue == f"public.{GONE}"
    assert isinstance(failed.message, TransportMessage)
    assert failed.message.headers[Headers.MESSAGE_ID] == message_id


async def test_a_sender_publish_writes_only_to_queue_tables(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    await prepare(transport)
    # Columns a send would fill, but no queue (no seq): a table a subscriber row must not name.
    await transport.pool.execute(
        "CREATE TABLE lookalike (id uuid, expires timestamp, headers text, body bytea)")
    await subscribe_gone(transport, "lookalike")
    async with Sender("web", TransportSettings(dsn=database_dsn)) as sender:
        with pytest.raises(NotAQueueError, match="lookalike"):
            await sender.publish(OrderPlaced("o-5"))

    assert await transport.pool.fetchval("SELECT count(*) FROM lookalike") == 0
    assert [await transport.depth(s.name) for s in SUBSCRIBERS] == [0, 0]  # all or nothing


async def test_a_sender_publish_keeps_to_the_allowed_schemas(
    transport: PostgresTransport, database_dsn: str,
) -> None:
    await prepare(transport)
    await transport.pool.execute("CREATE SCHEMA elsewhere")
    await transport.create_queue("elsewhere.tracker")
    await subscribe_gone(transport, "elsewhere.tracker")
    settings = TransportSettings(dsn=database_dsn, allowed_schemas=("public",))
    async with Sender("web", settings) as sender:
        with pytest.raises(NotAQueueError, match="allowed public"):
            await sender.publish(OrderPlaced("o-6"))
    assert await transport.depth("elsewhere.tracker") == 0

    async with Sender("web", TransportSettings(dsn=database_dsn)) as sender:  # any schema
        await sender.publish(OrderPlaced("o-7"))
    assert await transport.depth("elsewhere.tracker") == 1


@pytest.mark.parametrize("name", ["receive_only", "at_most_once"])
async def test_a_queue_dropped_after_the_subscriber_list_was_read_is_caught_at_the_write(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher, *SUBSCRIBERS)
    pipeline = publisher.create_pipeline()  # one subscriber cache for both messages
    strategy = publisher.create_strategy(pipeline, transport.pool, publisher.settings)
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        await transport.send(publisher.name, create_outgoing(PlaceOrder("o-1")))
        assert (await slot.round()).handled == 1
        await transport.drop_queue("analytics_sub")  # the cached list still names it
        await transport.send(publisher.name, create_outgoing(PlaceOrder("o-2")))
        assert (await slot.round()).handled == 1
        await slot.close()

    assert await transport.depth("billing_sub") == 2  # once each: no attempt failed
    [failed] = await list_failed(transport)
    assert failed.failed_queue == "public.analytics_sub"
    assert isinstance(failed.message, TransportMessage)
    assert msgspec.json.decode(failed.message.body, type=OrderPlaced) == OrderPlaced("o-2")


@pytest.mark.parametrize("name", ["retrying_atomic", "retrying_batched"])
async def test_a_queue_dropped_after_the_subscriber_list_was_read_costs_one_attempt_in_atomic_modes(
    transport: PostgresTransport, name: str,
) -> None:
    publisher: Endpoint = getattr(pubsub_endpoints, name)
    await prepare(transport, publisher, *SUBSCRIBERS)
    pipeline = publisher.create_pipeline()  # one subscriber cache for both messages
    strategy = publisher.create_strategy(pipeline, transport.pool, publisher.settings)
    async with transport.pool.acquire() as connection:
        slot = strategy.open_slot(connection)
        await transport.send(publisher.name, create_outgoing(PlaceOrder("o-1")))
        while (await slot.round()).taken:
            pass
        await transport.drop_queue("analytics_sub")  # the cached list still names it
        await transport.send(publisher.name, create_outgoing(PlaceOrder("o-2")))
        rounds = []
        while (taken := await slot.round()).taken:
            rounds.append(taken)
        await slot.close()

    # The write fails at the commit once; the retry reads the subscribers again.
    assert sum(r.failed for r in rounds) == 1
    assert sum(r.handled for r in rounds) == 1
    assert await transport.depth("billing_sub") == 2
    [failed] = await list_failed(transport)
    assert failed.failed_queue == "public.analytics_sub"
    assert isinstance(failed.message, TransportMessage)
    assert msgspec.json.decode(failed.message.body, type=OrderPlaced) == OrderPlaced("o-2")
