"""Turning a typed message into an outgoing message with the standard headers."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import msgspec

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.message_kinds import check_publishable
from endpoint_runtime.messages import (
    JSON_CONTENT_TYPE,
    MACHINE,
    Headers,
    MessageIntent,
    OutgoingMessage,
    new_message_id,
    wire_time_now,
)
from endpoint_runtime.serialization import encode_body, message_type_name

_type_names: dict[type, str] = {}


def create_outgoing(
    message: msgspec.Struct,
    *,
    intent: MessageIntent = MessageIntent.SEND,
    originating_endpoint: str | None = None,
    reply_to: str | None = None,
    conversation_id: str | None = None,
    correlation_id: str | None = None,
    message_id: str | None = None,
    headers: Mapping[str, str] | None = None,
    time_to_be_received: timedelta | None = None,
) -> OutgoingMessage:
    """Serialize ``message`` and set the standard headers of a send, publish or reply.

    ``correlation_id`` defaults to the message's own id (a message sent from outside any
    handler starts a correlation); handlers pass the incoming message's (see
    :class:`~endpoint_runtime.context.HandlerContext`). A publish of a command raises
    :class:`ConfigurationError`.

    Example::

        outgoing = create_outgoing(PlaceOrder(order_id="1"), originating_endpoint="web")
    """
    if not isinstance(message, msgspec.Struct):
        raise ConfigurationError(f"messages are msgspec.Struct instances, not {type(message)!r}")
    if time_to_be_received is not None and time_to_be_received <= timedelta(0):
        raise ConfigurationError("time_to_be_received must be positive")
    message_type = type(message)
    if intent is MessageIntent.PUBLISH:
        check_publishable(message_type)
    message_id = message_id or new_message_id()
    type_name = _type_names.get(message_type)
    if type_name is None:
        type_name = _type_names[message_type] = message_type_name(message_type)
    standard = {
        Headers.MESSAGE_ID: message_id,
        Headers.CONTENT_TYPE: JSON_CONTENT_TYPE,
        Headers.ENCLOSED_MESSAGE_TYPES: type_name,
        Headers.TIME_SENT: wire_time_now(),
        Headers.CONVERSATION_ID: conversation_id or message_id,
        Headers.CORRELATION_ID: correlation_id or message_id,
        Headers.MESSAGE_INTENT: intent.value,
        Headers.ORIGINATING_MACHINE: MACHINE,
    }
    if originating_endpoint:
        standard[Headers.ORIGINATING_ENDPOINT] = originating_endpoint
    if reply_to:
        standard[Headers.REPLY_TO_ADDRESS] = reply_to
    ttbr = None
    if time_to_be_received is not None:
        ttbr = time_to_be_received.total_seconds()
        standard[Headers.TIME_TO_BE_RECEIVED] = _timespan(time_to_be_received)
    if headers:
        standard.update(headers)
    return OutgoingMessage(
        message_id=message_id,
        headers=standard,
        body=encode_body(message),
        time_to_be_received=ttbr,
    )


def _timespan(delta: timedelta) -> str:
    """A .NET TimeSpan string (``d.hh:mm:ss.fffffff``), as NServiceBus writes TTBR."""
    total = delta.total_seconds()
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{int(hours):02d}:{int(minutes):02d}:{seconds:010.7f}"
    return f"{int(days)}.{text}" if days else text
