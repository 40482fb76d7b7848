"""Fulfilment: a saga that waits for "order placed" and "payment received", in either order.

The ``OrderFulfilment`` saga (``endpoint_runtime.sagas``), run by sales (:func:`add_to`), keeps
one instance per order id in its table ``"sales_OrderFulfilment"`` (NServiceBus SQL
persistence's layout). Both
messages start it, whichever comes first; the first one also requests a ``PaymentOverdue``
timeout. When both have come the order ships; when the timeout comes first the order is
cancelled. Either way the saga completes (its row is deleted) and the outcome is a row of
``fulfilment_outcomes``, written through ``context.connection``: it commits with the saga's
state and the receive. A timeout that arrives after the order shipped finds no instance and
is ignored.

``python -m handlers_examples`` sends, for each order of the run, the two messages (payment
first for every other order), except for every fifth order, whose payment never comes: those
are cancelled :data:`PAYMENT_TIMEOUT` later.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import msgspec

from endpoint_runtime import Command, Endpoint, Sender
from endpoint_runtime.sagas import Saga, handles, starts
from endpoint_runtime.transport.connection import DatabaseConnection

PAYMENT_TIMEOUT = timedelta(seconds=3)
"""How long the saga waits for the second message before it cancels the order."""
TABLE = '"sales_OrderFulfilment"'
"""The saga's table, in sales (``<endpoint>_<SagaName>``)."""
UNPAID_EVERY = 5
"""Every fifth order of a run is never paid: cancelled after the timeout."""


class FulfilOrder(msgspec.Struct, Command, frozen=True, kw_only=True):
    """To fulfilment: an order was placed and waits for its payment."""

    order_id: str


class PaymentReceived(msgspec.Struct, Command, frozen=True, kw_only=True):
    """To fulfilment: the payment of an order came in."""

    order_id: str


class PaymentOverdue(msgspec.Struct, Command, frozen=True, kw_only=True):
    """The saga's timeout: the second message did not come in time."""

    order_id: str


class FulfilmentState(msgspec.Struct):
    order_id: str  # the correlation: set from the message that starts an instance
    placed: bool = False
    paid: bool = False


OUTCOMES = """
CREATE TABLE IF NOT EXISTS fulfilment_outcomes (
    order_id   text PRIMARY KEY,
    outcome    text NOT NULL,
    decided_at timestamptz NOT NULL DEFAULT now()
)"""


class OrderFulfilment(Saga[FulfilmentState]):
    """Ship once placed and paid, in any order; cancel when the payment is overdue."""

    correlation = "order_id"  # stated once: every message's order_id holds the value

    @starts
    async def placed(self, message: FulfilOrder) -> None:
        self.state.placed = True
        await self.step_forward()

    @starts
    async def paid(self, message: PaymentReceived) -> None:
        self.state.paid = True
        await self.step_forward()

    @handles  # a timeout finds its instance by saga id
    async def overdue(self, message: PaymentOverdue) -> None:
        await self.decide("cancelled")

    async def step_forward(self) -> None:
        if self.is_new:
            await self.request_timeout(PaymentOverdue(order_id=self.state.order_id),
                                       delay=PAYMENT_TIMEOUT)
        if self.state.placed and self.state.paid:
            await self.decide("shipped")

    async def decide(self, outcome: str) -> None:
        await self.context.connection.execute(
            "INSERT INTO fulfilment_outcomes (order_id, outcome) VALUES ($1, $2)",
            self.state.order_id, outcome)
        self.mark_as_complete()


def add_to(endpoint: Endpoint) -> None:
    """Run the saga in ``endpoint`` (the example runs it in sales, beside its handlers: a
    saga needs no endpoint of its own), with its outcomes table."""
    endpoint.saga(OrderFulfilment)

    @endpoint.on_install(tables=["fulfilment_outcomes"])
    async def outcomes_table(connection: DatabaseConnection) -> None:
        await connection.execute(OUTCOMES)


def unpaid(index: int) -> bool:
    """Whether the ``index``-th order (from 1) of a run is never paid."""
    return index % UNPAID_EVERY == 0


async def send_orders(sender: Sender, order_ids: list[str]) -> None:
    """The two messages of every order to the saga's endpoint, by the sender's routes (payment
    first for every other one; none for the unpaid ones)."""
    for index, order_id in enumerate(order_ids, start=1):
        messages: list[msgspec.Struct] = [FulfilOrder(order_id=order_id)]
        if not unpaid(index):
            messages.append(PaymentReceived(order_id=order_id))
        if index % 2 == 0:
            messages.reverse()
        for message in messages:
            await sender.send(message)


async def outcomes(pool: asyncpg.Pool, order_ids: list[str]) -> dict[str, int]:
    """Orders of ``order_ids`` by outcome (``shipped``, ``cancelled``), and ``live``: their
    saga instances still running."""
    counts = {"shipped": 0, "cancelled": 0, "live": 0}
    for row in await pool.fetch(
            "SELECT outcome, count(*) FROM fulfilment_outcomes WHERE order_id = ANY($1::text[]) "
            "GROUP BY 1", order_ids):
        counts[row["outcome"]] = row["count"]
    counts["live"] = await pool.fetchval(
        f'SELECT count(*) FROM {TABLE} WHERE "Correlation_order_id" = ANY($1::text[])',
        order_ids)
    return counts


def expected(count: int) -> dict[str, int]:
    cancelled = sum(unpaid(i) for i in range(1, count + 1))
    return {"shipped": count - cancelled, "cancelled": cancelled, "live": 0}
