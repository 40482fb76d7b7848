"""Endpoints run under a role that may only use their own tables (importable by path).

The handler records the order in the business table ``orders`` (granted), sends
``OrderAccepted`` to ``lp_billing`` (a queue the role may only insert into), defers the order
once when asked (the delayed store and its mover), and fails when asked (a delayed retry,
then the error queue). Audit copies go to ``lp_audit``.
"""

from __future__ import annotations

from datetime import timedelta

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, TransactionMode
from endpoint_runtime.settings import OutboxSettings

BILLING = "lp_billing"
BUSINESS_TABLE = "orders"


class PlaceOrder(msgspec.Struct):
    order_id: str
    behaviour: str = "ok"  # ok | fail | defer


class OrderAccepted(msgspec.Struct):
    order_id: str


async def place_order(message: PlaceOrder, context: HandlerContext) -> None:
    if message.behaviour == "fail":
        raise RuntimeError(f"order {message.order_id} fails")
    if message.behaviour == "defer":
        await context.send_local(PlaceOrder(message.order_id), delay=timedelta(seconds=0.3))
        return
    await context.connection.execute(
        f"INSERT INTO {BUSINESS_TABLE} (order_id) VALUES ($1)", message.order_id)
    await context.send(OrderAccepted(message.order_id), BILLING)


def make(name: str, mode: TransactionMode, outbox: OutboxSettings | None = None) -> Endpoint:
    endpoint = Endpoint(name, transaction_mode=mode, immediate_retries=0, delayed_retries=1,
                        delayed_retry_delay=0.3, audit_queue="lp_audit", max_concurrency=2,
                        slots_per_receiver=2, outbox=outbox)
    endpoint.register(place_order)
    return endpoint


atomic = make("lp_sales", TransactionMode.SENDS_ATOMIC_WITH_RECEIVE)
with_outbox = make("lp_sales_outbox", TransactionMode.RECEIVE_ONLY, OutboxSettings())
