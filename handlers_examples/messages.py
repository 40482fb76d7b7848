"""Messages of the example order flow: sales -> billing -> shipping -> notifications.

Message types are plain ``msgspec.Struct`` classes. Their wire name (header
``NServiceBus.EnclosedMessageTypes``) is ``module.QualName``, e.g.
``handlers_examples.messages.PlaceOrder``; a peer written in .NET would set
``__message_type_name__`` to its own type name instead.

Money is a :class:`~decimal.Decimal` (a JSON string on the wire, ``numeric`` in PostgreSQL), so
no amount is ever rounded through a float.
"""

from __future__ import annotations

from decimal import Decimal

import msgspec


class PlaceOrder(msgspec.Struct, frozen=True, kw_only=True):
    """Command to sales: a customer wants ``quantity`` of ``product``."""

    order_id: str
    customer: str
    product: str
    quantity: int
    unit_price: Decimal


class OrderReceived(msgspec.Struct, frozen=True, kw_only=True):
    """Reply from sales to whoever sent PlaceOrder (when it gave a ReplyToAddress)."""

    order_id: str
    amount: Decimal


class OrderAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """Sales -> billing: the order is stored and must be invoiced."""

    order_id: str
    customer: str
    amount: Decimal


class OrderBilled(msgspec.Struct, frozen=True, kw_only=True):
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
