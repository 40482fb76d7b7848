"""Notifications: tells customers their parcel is on its way and that they earned points.
Mode NONE.

The message is deleted (committed) before the handler runs: no transaction is held open while
the e-mail goes out, and no retries. If the handler fails, the notification is not retried; a
copy goes to the error queue so it is not lost from sight. That is at-most-once delivery,
right for a fire-and-forget courtesy e-mail, wrong for money.
"""

from __future__ import annotations

import structlog

from endpoint_runtime import Endpoint, HandlerContext, NoTransaction
from handlers_examples.messages import OrderShipped, PointsAwarded

log = structlog.get_logger("handlers_examples.notifications")

endpoint = Endpoint("notifications", transaction=NoTransaction(), max_concurrency=4,
                    audit_queue="audit")


@endpoint.handler
async def email_customer(message: OrderShipped, context: HandlerContext) -> None:
    # A real endpoint would call a mail service here; debug level keeps the example quiet.
    log.debug(
        "shipping_email_sent",
        customer=message.customer, order_id=message.order_id, carrier=message.carrier,
    )


@endpoint.handler
async def tell_points_awarded(message: PointsAwarded, context: HandlerContext) -> None:
    # Sent by loyalty through its outbox: once per order, however often AwardPoints came.
    log.debug(
        "points_email_sent",
        customer=message.customer, order_id=message.order_id, points=message.points,
    )
