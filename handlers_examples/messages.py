"""Messages of the example order flow: sales -> billing -> shipping -> notifications, and
sales -> loyalty (-> loyalty, deferred) -> notifications; sales publishes OrderPlaced to billing
and analytics.

Message types are ``msgspec.Struct`` classes. Their wire name (header
``NServiceBus.EnclosedMessageTypes``) is ``module.QualName``, e.g.
``handlers_examples.messages.PlaceOrder``; a peer written in .NET would set
``__message_type_name__`` to its own type name instead.

Commands (sent to the one endpoint that owns them) mix in :class:`Command`, the event
OrderPlaced mixes in :class:`Event`: an endpoint subscribes at start to the events it handles,
never to its commands, and a publish of a command fails. The other types declare neither
(plain messages: a reply, and notifications sent point to point).

Money is a :class:`~decimal.Decimal` (a JSON string on the wire, ``numeric`` in PostgreSQL), so
no amount is ever rounded through a float.
"""

from __future__ import annotations

from decimal import Decimal

import msgspec

from endpoint_runtime import Command, Event


class PlaceOrder(msgspec.Struct, Command, frozen=True, kw_only=True):
    """Command to sales: a customer wants ``quantity`` of ``product``."""

    order_id: str
    customer: str
    product: str
    quantity: int
    unit_price: Decimal

    @property
    def amount(self) -> Decimal:
        """What the order costs: ``unit_price`` x ``quantity``."""
        return self.unit_price * self.quantity


class OrderReceived(msgspec.Struct, frozen=True, kw_only=True):
    """Reply from sales to whoever sent PlaceOrder (when it gave a ReplyToAddress)."""

    order_id: str
    amount: Decimal


class OrderPlaced(msgspec.Struct, Event, frozen=True, kw_only=True):
    """Event published by sales once an order is stored: every subscriber gets a copy
    (billing and analytics subscribe, by handling it)."""

    order_id: str
    customer: str
    product: str
    amount: Decimal


class OrderAccepted(msgspec.Struct, Command, frozen=True, kw_only=True):
    """Sales -> billing: the order is stored and must be invoiced."""

    order_id: str
    customer: str
    amount: Decimal


class OrderBilled(msgspec.Struct, Command, frozen=True, kw_only=True):
    """Billing -> shipping: the invoice exists, the goods may leave."""

    order_id: str
    invoice_id: str
    customer: str
    amount: Decimal


class OrderShipped(msgspec.Struct, frozen=True, kw_only=True):
    """Shipping -> notifications: the parcel is with a carrier."""

    order_id: str
    shipment_id: str
    customer: str
    carrier: str


class AwardPoints(msgspec.Struct, Command, frozen=True, kw_only=True):
    """Sales -> loyalty: credit the customer with points for an accepted order.

    Sent with the message id :func:`award_points_message_id` of the order.
    """

    order_id: str
    customer: str
    amount: Decimal


def award_points_message_id(order_id: str) -> str:
    """The message id of an order's AwardPoints, derived from the order id.

    A copy sent again with this id is what a redelivery looks like to loyalty, whose outbox
    deduplicates by message id (``python -m handlers_examples`` sends a few such copies on
    purpose). Message ids need not be UUIDs: a queue row then gets a fresh row id of its own,
    so a copy never collides with the original in the queue table.
    """
    return f"award-points/{order_id}"


class PointsAwarded(msgspec.Struct, frozen=True, kw_only=True):
    """Loyalty -> notifications: the customer has new points."""

    order_id: str
    customer: str
    points: int


class PointsExpiryReminder(msgspec.Struct, Command, frozen=True, kw_only=True):
    """Loyalty -> loyalty, deferred: time to remind the customer that points will expire."""

    order_id: str
    customer: str
    points: int
