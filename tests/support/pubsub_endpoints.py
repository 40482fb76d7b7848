"""Endpoints for the publish/subscribe and audit tests (importable by path)."""

from __future__ import annotations

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.settings import OutboxSettings


class PlaceOrder(msgspec.Struct):
    order: str
    fail: bool = False


class OrderPlaced(msgspec.Struct):
    order: str


class PriorityOrderPlaced(OrderPlaced):
    """Derived event: subscribers to OrderPlaced receive it too."""

    priority: int = 1


class ShipmentBooked(msgspec.Struct):
    """An event as an NServiceBus endpoint names it."""

    __message_type_name__ = "Shipping.Messages.Events.ShipmentBooked"
    ShipmentId: str


def publisher(name: str, mode: TransactionMode, *, immediate_retries: int = 0,
              **options: object) -> Endpoint:
    endpoint = Endpoint(name, transaction_mode=mode, immediate_retries=immediate_retries,
                        delayed_retries=0, audit_queue="audit",
                        **options)  # type: ignore[arg-type]

    @endpoint.handler
    async def place(message: PlaceOrder, context: HandlerContext) -> None:
        await context.connection.execute("INSERT INTO placed (order_id) VALUES ($1)",
                                          message.order)
        if message.order.startswith("priority"):
            await context.publish(PriorityOrderPlaced(message.order, priority=2))
        else:
            await context.publish(OrderPlaced(message.order))
        if message.fail:
            raise RuntimeError("the order cannot be placed")

    return endpoint


atomic = publisher("sales_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE)
receive_only = publisher("sales_receive_only", TransactionMode.RECEIVE_ONLY)
batched = publisher("sales_batched", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, batch_size=3)
at_most_once = publisher("sales_none", TransactionMode.NONE)
with_outbox = publisher("sales_outbox", TransactionMode.RECEIVE_ONLY, outbox=OutboxSettings())

PUBLISHERS = ("atomic", "receive_only", "batched", "at_most_once", "with_outbox")
retrying_receive_only = publisher("sales_retrying", TransactionMode.RECEIVE_ONLY,
                                  immediate_retries=3)
"""Receive-only with immediate retries: each failed attempt would publish again."""
retrying_atomic = publisher("sales_retrying_atomic", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE,
                            immediate_retries=3)
retrying_batched = publisher("sales_retrying_batched",
                             TransactionMode.SENDS_ATOMIC_WITH_RECEIVE, immediate_retries=3,
                             batch_size=3)


def subscriber(name: str) -> Endpoint:
    endpoint = Endpoint(name, immediate_retries=0, delayed_retries=0)

    @endpoint.handler
    async def placed(message: OrderPlaced, context: HandlerContext) -> None:
        await context.connection.execute(
            "INSERT INTO seen (endpoint, order_id, type_name) VALUES ($1, $2, $3)",
            name, message.order, type(message).__name__)

    @endpoint.handler
    async def booked(message: ShipmentBooked, context: HandlerContext) -> None:
        await context.connection.execute(
            "INSERT INTO seen (endpoint, order_id, type_name) VALUES ($1, $2, $3)",
            name, message.ShipmentId, type(message).__name__)

    return endpoint


billing = subscriber("billing_sub")
analytics = subscriber("analytics_sub")
