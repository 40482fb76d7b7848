"""Analytics: counts placed orders per product. Mode SENDS_ATOMIC_WITH_RECEIVE.

It never receives a command: it subscribes to sales' OrderPlaced event (a deployment subscribes
to every type it handles) and keeps running totals. The event row and the totals commit with
the receive; a redelivered event is recognised by its order id.
"""

from __future__ import annotations

from endpoint_runtime import Endpoint, HandlerContext
from handlers_examples.messages import OrderPlaced
from handlers_examples.schema import ORDER_EVENTS

endpoint = Endpoint("analytics", max_concurrency=2, audit_queue="audit", schema_sql="""
    CREATE TABLE IF NOT EXISTS product_sales (
        product     text PRIMARY KEY,
        orders      bigint NOT NULL,
        amount      numeric(14, 2) NOT NULL
    );
    """ + ORDER_EVENTS)


@endpoint.handler
async def count_order(message: OrderPlaced, context: HandlerContext) -> None:
    first = await context.connection.fetchval(
        "INSERT INTO order_events (endpoint, order_id) VALUES ('analytics', $1) "
        "ON CONFLICT DO NOTHING RETURNING true", message.order_id)
    if first:
        await context.connection.execute(
            """
            INSERT INTO product_sales (product, orders, amount) VALUES ($1, 1, $2)
            ON CONFLICT (product) DO UPDATE
            SET orders = product_sales.orders + 1, amount = product_sales.amount + $2
            """,
            message.product, message.amount)
