"""Sales: takes orders. Mode SENDS_ATOMIC_WITH_RECEIVE.

The order row, the OrderAccepted to billing, the AwardPoints to loyalty (both by their routes,
below), the OrderPlaced event
to its subscribers, the reply to the customer's client and the removal of PlaceOrder from the
queue commit as one transaction:
either the order exists and billing and loyalty hear of it, or none of it happened and
PlaceOrder is retried.

Run it on its own with ``endpoint-runtime run handlers_examples.sales:endpoint``.
"""

from __future__ import annotations

import structlog

from endpoint_runtime import Atomic, Endpoint, HandlerContext, Headers
from handlers_examples import fulfilment
from handlers_examples.messages import (
    AwardPoints,
    OrderAccepted,
    OrderPlaced,
    OrderReceived,
    PlaceOrder,
    award_points_message_id,
)
from handlers_examples.tenancy import carry_tenant

log = structlog.get_logger("handlers_examples.sales")

PRODUCTS = frozenset({"keyboard", "mouse", "monitor", "headset", "webcam"})


class InvalidOrder(Exception):
    """The order can never succeed: retrying is pointless, it goes straight to the error
    queue (listed in ``unrecoverable_exceptions`` below)."""


endpoint = Endpoint(
    "sales",
    transaction=Atomic(),
    max_concurrency=4,
    unrecoverable_exceptions=(InvalidOrder,),
    audit_queue="audit",
    # Its business table, created at start (with installers) or by `endpoint-runtime db
    # install`; idempotent, as it runs every time.
    schema_sql="""
    CREATE TABLE IF NOT EXISTS orders (
        order_id    text PRIMARY KEY,
        customer    text NOT NULL,
        product     text NOT NULL,
        quantity    integer NOT NULL CHECK (quantity > 0),
        amount      numeric(12, 2) NOT NULL,
        accepted_at timestamptz NOT NULL DEFAULT now()
    );
    """,
)
# Where its commands go, by type: the handlers below never name a queue (docs/routing.md).
endpoint.route(OrderAccepted, to="billing")
endpoint.route(AwardPoints, to="loyalty")
# Every message sales sends carries the order's tenant (handlers_examples/tenancy.py).
carry_tenant(endpoint)
# The order-fulfilment saga runs here too (handlers_examples/fulfilment.py).
fulfilment.add_to(endpoint)


@endpoint.handler
async def place_order(message: PlaceOrder, context: HandlerContext) -> None:
    if message.quantity < 1:
        raise InvalidOrder(f"order {message.order_id}: quantity must be positive")
    if message.product not in PRODUCTS:
        raise InvalidOrder(f"order {message.order_id}: unknown product {message.product!r}")
    amount = message.amount
    # Written in the receive transaction: commits with the sends below, or not at all.
    # ON CONFLICT makes a redelivered PlaceOrder harmless (at-least-once delivery).
    inserted = await context.connection.fetchval(
        """
        INSERT INTO orders (order_id, customer, product, quantity, amount)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (order_id) DO NOTHING
        RETURNING true
        """,
        message.order_id, message.customer, message.product, message.quantity, amount,
    )
    if not inserted:
        log.info("duplicate_order_ignored", order_id=message.order_id)
        return
    await context.send(
        OrderAccepted(order_id=message.order_id, customer=message.customer, amount=amount))
    # Commits with the order too. Its message id is derived from the order id (see
    # award_points_message_id), so loyalty's outbox recognises any copy of it.
    await context.send(
        AwardPoints(order_id=message.order_id, customer=message.customer, amount=amount),
        message_id=award_points_message_id(message.order_id),
    )
    # An event: one copy to each subscriber (billing, analytics), committed with the order too.
    await context.publish(OrderPlaced(order_id=message.order_id, customer=message.customer,
                                      product=message.product, amount=amount))
    # A client that gave a ReplyToAddress (a Sender with a queue of its own) gets an answer;
    # one-way senders such as `endpoint-runtime send` do not.
    if context.headers.get(Headers.REPLY_TO_ADDRESS):
        await context.reply(OrderReceived(order_id=message.order_id, amount=amount))
