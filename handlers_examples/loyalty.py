"""Loyalty: awards points for accepted orders. Mode RECEIVE_ONLY with the outbox; delayed delivery.

For each AwardPoints (sent by sales in its atomic transaction) the handler inserts the points
into ``loyalty_points``, sends PointsAwarded to notifications and defers a PointsExpiryReminder
to loyalty's own queue (``context.send_local(..., delay=REMINDER_DELAY)``). When it is due,
the reminder's handler marks the row reminded.

The outbox (``transaction=Outbox(...)``: receive-only transactions with the outbox) makes
this happen exactly once per message id.
``context.connection`` is a business transaction that also stores the message's outbox record,
with the outgoing messages in it, and the two commit together. The messages are then
dispatched from the record: PointsAwarded goes to its queue, and the reminder goes to loyalty's
delayed-message store (``"loyalty.delayed"``), from which the mover of loyalty's deployment
delivers it when due. A redelivered AwardPoints finds its record, so the handler does not run
again; its messages are dispatched only if the first delivery did not get that far, and a
record is dispatched once. That is why the handler below needs no duplicate check: a plain
INSERT (a second one would fail on the primary key) and sends without conditions. Compare
billing, which is receive-only without the outbox: it must check its own insert and can still
send ghost messages. ``python -m handlers_examples`` sends a few AwardPoints copies again on
purpose: a copy that got past the outbox would fail on the primary key, so loyalty's zero
failed attempts, and its handler count (one award and one reminder per order), show that the
copies reached no handler.

Concurrency control: pessimistic (``Outbox(pessimistic=True)``). A placeholder record is
inserted before the handler runs, so a copy handled at the same moment as the original blocks
on it and then finds the record: the handler body runs once per message id, always. The price
is one more statement per message, which is negligible at loyalty's volume (one message per
order). With the default, optimistic, a concurrent copy would run the body too: its plain
INSERT would fail on the primary key, the attempt would be retried and would then find the
record. The effect would still be exactly once, but with a failed attempt in the counts.
Optimistic suits hot endpoints whose duplicates are rare and never concurrent.
"""

from __future__ import annotations

from datetime import timedelta

import structlog

from endpoint_runtime import Endpoint, HandlerContext, Outbox
from handlers_examples.messages import AwardPoints, PointsAwarded, PointsExpiryReminder
from handlers_examples.tenancy import carry_tenant

log = structlog.get_logger("handlers_examples.loyalty")

REMINDER_DELAY = timedelta(seconds=2)
"""How long after the award the expiry reminder is delivered. A real programme would use
``deliver_at=`` some weeks before the points expire; the example keeps it short so that a run
completes fast while still showing delayed delivery end to end."""

endpoint = Endpoint("loyalty", transaction=Outbox(pessimistic=True), max_concurrency=4,
                    audit_queue="audit", schema_sql="""
    CREATE TABLE IF NOT EXISTS loyalty_points (
        order_id       text PRIMARY KEY,
        customer       text NOT NULL,
        points         integer NOT NULL CHECK (points >= 0),
        awarded_at     timestamptz NOT NULL DEFAULT now(),
        reminded_at    timestamptz
    );
    """)
# Inside the outbox's business transaction, like the handlers (handlers_examples/tenancy.py).
carry_tenant(endpoint)
endpoint.route(PointsAwarded, to="notifications")  # by type (docs/routing.md)


def points_for(message: AwardPoints) -> int:
    """One point per whole unit of currency spent."""
    return int(message.amount)


@endpoint.handler
async def award_points(message: AwardPoints, context: HandlerContext) -> None:
    points = points_for(message)
    # The business transaction of the outbox: this row, the outbox record and the two
    # messages below take effect together, and once per message id.
    await context.connection.execute(
        "INSERT INTO loyalty_points (order_id, customer, points) VALUES ($1, $2, $3)",
        message.order_id, message.customer, points,
    )
    await context.send(
        PointsAwarded(order_id=message.order_id, customer=message.customer, points=points))
    await context.send_local(
        PointsExpiryReminder(order_id=message.order_id, customer=message.customer,
                             points=points),
        delay=REMINDER_DELAY,
    )


@endpoint.handler
async def remind_expiry(message: PointsExpiryReminder, context: HandlerContext) -> None:
    # A real endpoint would e-mail the customer here. The reminder comes through the outbox
    # too, so a redelivered one would not run this again.
    await context.connection.execute(
        "UPDATE loyalty_points SET reminded_at = now() WHERE order_id = $1", message.order_id,
    )
    log.debug("points_expiry_reminder", order_id=message.order_id, customer=message.customer,
              points=message.points)
