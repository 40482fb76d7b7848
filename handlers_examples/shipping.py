"""Shipping: books a carrier for billed orders. Mode SENDS_ATOMIC_WITH_RECEIVE, batched.

``Atomic(batch=10)`` turns on batched atomic receive: up to ten OrderBilled messages are taken in
one transaction and committed once. Each message's database work runs in its own savepoint, so
a message that fails is rolled back and re-queued on its own while the rest of the batch
commits; the per-message guarantee is the same as unbatched atomic mode.

The carrier booking is a simulated flaky API: the first attempt for roughly one order in ten
fails with :class:`CarrierTimeout`, so the example shows immediate retries at work.
"""

from __future__ import annotations

import uuid
import zlib

import structlog

from endpoint_runtime import Atomic, Endpoint, HandlerContext
from handlers_examples.messages import OrderBilled, OrderShipped

log = structlog.get_logger("handlers_examples.shipping")

CARRIERS = ("DHL", "UPS", "PostNL", "DPD")

endpoint = Endpoint(
    "shipping",
    transaction=Atomic(batch=10),
    max_concurrency=4,
    audit_queue="audit",
    schema_sql="""
    CREATE TABLE IF NOT EXISTS shipments (
        shipment_id uuid PRIMARY KEY,
        order_id    text NOT NULL UNIQUE,
        carrier     text NOT NULL,
        shipped_at  timestamptz NOT NULL DEFAULT now()
    );
    """,
)
endpoint.route(OrderShipped, to="notifications")  # by type (docs/routing.md)


class CarrierTimeout(Exception):
    """The carrier's booking API did not answer in time (transient: retried)."""


# Orders whose booking already timed out once in this receiver process.
_timed_out_once: set[str] = set()


def book_carrier(order_id: str) -> str:
    """Pick a carrier; about one order in ten times out on its first attempt."""
    checksum = zlib.crc32(order_id.encode())
    if checksum % 10 == 0 and order_id not in _timed_out_once:
        _timed_out_once.add(order_id)
        raise CarrierTimeout(f"carrier booking for order {order_id} timed out")
    return CARRIERS[checksum % len(CARRIERS)]


@endpoint.handler
async def ship_order(message: OrderBilled, context: HandlerContext) -> None:
    carrier = book_carrier(message.order_id)
    shipment_id = await context.connection.fetchval(
        """
        INSERT INTO shipments (shipment_id, order_id, carrier)
        VALUES ($1, $2, $3)
        ON CONFLICT (order_id) DO NOTHING
        RETURNING shipment_id
        """,
        uuid.uuid4(), message.order_id, carrier,
    )
    if shipment_id is None:
        # Billing is receive-only: a ghost OrderBilled for a shipped order is expected.
        log.info("duplicate_order_ignored", order_id=message.order_id)
        return
    await context.send(
        OrderShipped(
            order_id=message.order_id, shipment_id=str(shipment_id),
            customer=message.customer, carrier=carrier,
        ),
    )
