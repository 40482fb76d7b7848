"""The examples' handlers that write business data, tested with the testable handler context
and a real connection (docs/handlers.md): each endpoint's own business schema creates its
table in a transaction the test rolls back; no Ray, no queues."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal

import asyncpg
import pytest

from endpoint_runtime import Headers
from endpoint_runtime.testing import invoke
from handlers_examples import billing, loyalty, sales
from handlers_examples.messages import (
    AwardPoints,
    OrderAccepted,
    OrderBilled,
    OrderPlaced,
    OrderReceived,
    PlaceOrder,
    PointsAwarded,
    PointsExpiryReminder,
    award_points_message_id,
)

ORDER = PlaceOrder(order_id="o-1", customer="ada", product="mouse", quantity=2,
                   unit_price=Decimal("19.95"))


@pytest.fixture
async def connection(database_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection in a transaction that is rolled back after the test."""
    connection = await asyncpg.connect(database_dsn)
    transaction = connection.transaction()
    await transaction.start()
    try:
        for endpoint in (sales.endpoint, billing.endpoint, loyalty.endpoint):
            await endpoint.business_schema.install(connection)  # a savepoint in it
        yield connection
    finally:
        await transaction.rollback()
        await connection.close()


async def test_sales_stores_the_order_sends_publishes_and_replies(
    connection: asyncpg.Connection,
) -> None:
    context = await invoke(sales.endpoint, ORDER, connection=connection,
                           subscribers={OrderPlaced: ["billing", "analytics"]})

    assert await connection.fetchval("SELECT amount FROM orders WHERE order_id = 'o-1'") \
        == Decimal("39.90")
    accepted, award = context.sent
    assert (accepted.destination, accepted.message) == (
        "billing", OrderAccepted(order_id="o-1", customer="ada", amount=Decimal("39.90")))
    assert award.destination == "loyalty"
    assert award.message_id == award_points_message_id("o-1")
    assert context.published[0].destinations == ("billing", "analytics")
    assert context.replied[0].message == OrderReceived(order_id="o-1", amount=Decimal("39.90"))

    again = await invoke(sales.endpoint, ORDER, connection=connection)  # a redelivery
    assert again.recorded == []


async def test_billing_sends_one_order_billed_per_order(connection: asyncpg.Connection) -> None:
    accepted = OrderAccepted(order_id="o-1", customer="ada", amount=Decimal("39.90"))

    first = await invoke(billing.endpoint, accepted, connection=connection)
    ghost = await invoke(billing.endpoint, accepted, connection=connection)

    [billed] = first.sent
    assert billed.destination == "shipping"
    assert isinstance(billed.message, OrderBilled)
    assert billed.headers[Headers.RELATED_TO] == first.message_id
    assert ghost.sent == []


async def test_loyalty_awards_points_and_defers_the_reminder(
    connection: asyncpg.Connection,
) -> None:
    award = AwardPoints(order_id="o-1", customer="ada", amount=Decimal("39.90"))

    context = await invoke(loyalty.endpoint, award, connection=connection)

    assert await connection.fetchval("SELECT points FROM loyalty_points") == 39
    awarded, reminder = context.sent
    assert awarded.message == PointsAwarded(order_id="o-1", customer="ada", points=39)
    assert context.deferred == [reminder]
    assert isinstance(reminder.message, PointsExpiryReminder)
    assert reminder.destination == "loyalty"
    assert reminder.due is not None
    assert reminder.due - datetime.now(UTC) <= loyalty.REMINDER_DELAY
