"""Billing: invoices accepted orders. Mode RECEIVE_ONLY.

The invoice row is written through ``context.connection``, the transaction that received
OrderAccepted, so it commits or rolls back with the receive. OrderBilled, however, leaves at once
on another connection: if the handler (or the commit) failed after the send, OrderAccepted would
be retried and shipping could see OrderBilled twice, a "ghost message". Shipping is written to
tolerate that (its insert is idempotent), which is what this mode asks of the receiving side.
"""

from __future__ import annotations

import uuid

import structlog

from endpoint_runtime import Endpoint, HandlerContext, ReceiveOnly
from handlers_examples.messages import OrderAccepted, OrderBilled, OrderPlaced
from handlers_examples.schema import ORDER_EVENTS
from handlers_examples.tenancy import carry_tenant

log = structlog.get_logger("handlers_examples.billing")

endpoint = Endpoint("billing", transaction=ReceiveOnly(), max_concurrency=4,
                    audit_queue="audit", schema_sql="""
    CREATE TABLE IF NOT EXISTS invoices (
        invoice_id  uuid PRIMARY KEY,
        order_id    text NOT NULL UNIQUE,
        customer    text NOT NULL,
        amount      numeric(12, 2) NOT NULL,
        billed_at   timestamptz NOT NULL DEFAULT now()
    );
    """ + ORDER_EVENTS)
endpoint.route(OrderBilled, to="shipping")  # its one command, by type (docs/routing.md)
carry_tenant(endpoint)  # the tenant travels on to shipping (handlers_examples/tenancy.py)


@endpoint.handler
async def bill_order(message: OrderAccepted, context: HandlerContext) -> None:
    invoice_id = await context.connection.fetchval(
        """
        INSERT INTO invoices (invoice_id, order_id, customer, amount)
        VALUES ($1, $2, $3, $4)
        ON CONFLICT (order_id) DO NOTHING
        RETURNING invoice_id
        """,
        uuid.uuid4(), message.order_id, message.customer, message.amount,
    )
    if invoice_id is None:
        # Already invoiced by an earlier delivery, whose OrderBilled has already left.
        log.info("duplicate_order_ignored", order_id=message.order_id)
        return
    # Sent last: in receive-only mode this INSERT into "shipping" commits immediately.
    await context.send(
        OrderBilled(
            order_id=message.order_id, invoice_id=str(invoice_id),
            customer=message.customer, amount=message.amount,
        ),
    )


@endpoint.handler
async def note_order_placed(message: OrderPlaced, context: HandlerContext) -> None:
    """Subscribed by handling it: billing hears of every order as it is placed."""
    await context.connection.execute(
        "INSERT INTO order_events (endpoint, order_id) VALUES ('billing', $1) "
        "ON CONFLICT DO NOTHING", message.order_id)
