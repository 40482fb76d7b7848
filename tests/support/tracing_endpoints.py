"""A compact order flow with tracing on (importable by path): sales -> (publish) billing ->
(a deferred send) shipping, with a failure retried at once in billing and one that goes
through a delayed retry to the error queue in shipping.

- ``trace_sales`` handles :class:`PlaceTracedOrder` and publishes :class:`TracedOrderPlaced`.
- ``trace_billing`` handles the event; the first attempt at an order whose id starts with
  ``flaky`` fails (counted in the receiver's memory: one receiver), the next succeeds; it then
  sends :class:`ShipTracedOrder` to shipping with a short delay.
- ``trace_shipping`` handles it; an order whose id starts with ``doomed`` always fails: one
  immediate retry, one delayed retry, then the error queue.
- ``trace_batched`` receives batches of 5 (optimistic isolation, one slot): its handler runs a
  statement, and the first attempt at an order whose id starts with ``fail-once`` then fails,
  so that its batch rolls back and runs the messages before it again.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import msgspec

from endpoint_runtime import Command, Endpoint, Event, HandlerContext

SHIP_DELAY = timedelta(milliseconds=300)


class PlaceTracedOrder(msgspec.Struct, Command):
    order_id: str


class TracedOrderPlaced(msgspec.Struct, Event):
    order_id: str


class ShipTracedOrder(msgspec.Struct, Command):
    order_id: str


class BatchedTracedOrder(msgspec.Struct, Command):
    order_id: str


def traced(name: str, **options: object) -> Endpoint:
    settings: dict[str, object] = {"max_concurrency": 2, "slots_per_receiver": 2, **options}
    return Endpoint(name, tracing=True, audit_queue="audit", **settings)  # type: ignore[arg-type]


sales = traced("trace_sales")
billing = traced("trace_billing", immediate_retries=1, delayed_retries=0)
shipping = traced("trace_shipping", immediate_retries=1, delayed_retries=1,
                  delayed_retry_delay=0.3)
batched = traced("trace_batched", batch_size=5, max_concurrency=1, slots_per_receiver=1,
                 immediate_retries=1, delayed_retries=0)

_billing_attempts: Counter[str] = Counter()
_batched_attempts: Counter[str] = Counter()


@sales.handler
async def place(message: PlaceTracedOrder, context: HandlerContext) -> None:
    await context.publish(TracedOrderPlaced(order_id=message.order_id))


@billing.handler
async def bill(message: TracedOrderPlaced, context: HandlerContext) -> None:
    _billing_attempts[message.order_id] += 1
    if message.order_id.startswith("flaky") and _billing_attempts[message.order_id] == 1:
        raise RuntimeError(f"card declined for {message.order_id} (once)")
    await context.send(ShipTracedOrder(order_id=message.order_id), "trace_shipping",
                       delay=SHIP_DELAY)


@shipping.handler
async def ship(message: ShipTracedOrder, context: HandlerContext) -> None:
    if message.order_id.startswith("doomed"):
        raise LookupError(f"no address for {message.order_id}")


@batched.handler
async def count_batched(message: BatchedTracedOrder, context: HandlerContext) -> None:
    await context.connection.execute("SELECT 1")  # its work: a failure after it rolls back
    _batched_attempts[message.order_id] += 1
    if message.order_id.startswith("fail-once") and _batched_attempts[message.order_id] == 1:
        raise RuntimeError(f"refused {message.order_id} (once)")
