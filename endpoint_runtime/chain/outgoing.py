"""The one outgoing path: a typed message becomes an outgoing message with the standard
headers, stamped with its due time when deferred, and passed to the outgoing hooks.

``HandlerContext`` and ``Sender`` build every message they send with :func:`create_outgoing`;
a deferred one (``delay``/``deliver_at``, :func:`due_time`) carries ``NServiceBus.DeliverAt``
and waits in the delayed-message store as :func:`delayed_message` makes it, as recoverability's
delayed retries do. Outgoing hooks (``hook(headers)``) see the headers of each message before it
is encoded: how a step of the chain adds headers to every message the handlers send. A hook
with a true ``wants_destination`` attribute is called ``hook(headers, destination)`` instead,
``destination`` the queue of a send or reply (``None`` for a publish, which goes to many).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from datetime import datetime, timedelta
from typing import TypeAlias, cast

import msgspec

from endpoint_runtime.delayed.store import DelayedMessage
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.message_kinds import check_publishable
from endpoint_runtime.wire.messages import (
    JSON_CONTENT_TYPE,
    MACHINE,
    Headers,
    MessageIntent,
    OutgoingMessage,
    encode_headers,
    new_message_id,
    to_wire_time,
    utc_now,
    wire_time_now,
)
from endpoint_runtime.wire.serialization import encode_body, message_type_name

OutgoingHook: TypeAlias = Callable[[MutableMapping[str, str]], object]
"""Called with an outgoing message's headers to change them; what it returns is ignored (so
``lambda headers: headers.setdefault(...)`` is one)."""
"""Called with the headers of an outgoing message before it is encoded; may change them."""

_type_names: dict[type, str] = {}


def due_time(delay: timedelta | None, deliver_at: datetime | None,
             time_to_be_received: timedelta | None, can_defer: bool) -> datetime | None:
    """When a deferred message is due; ``None`` when it goes at once (no delay, or past due).

    Raises :class:`ConfigurationError` for a delay with a time-to-be-received, both a delay and
    a due time, a naive due time, or a sender that cannot defer (send-only).
    """
    if delay is None and deliver_at is None:
        return None
    if delay is not None and deliver_at is not None:
        raise ConfigurationError("give either delay or deliver_at, not both")
    if time_to_be_received is not None:
        raise ConfigurationError(
            "a delayed message cannot have a time_to_be_received: it could expire while waiting"
        )
    if not can_defer:
        raise ConfigurationError(
            "a send-only endpoint cannot defer messages (it has no delayed-message store)"
        )
    if deliver_at is not None and deliver_at.tzinfo is None:
        raise ConfigurationError("deliver_at must be an aware datetime (e.g. in UTC)")
    due = deliver_at if deliver_at is not None else utc_now() + (delay or timedelta(0))
    return due if due > utc_now() else None


def due_in(seconds: float) -> datetime:
    return utc_now() + timedelta(seconds=seconds)


def delayed_message(
    destination: QueueAddress, headers: dict[str, str], body: bytes, due: datetime,
    *, native_id: uuid.UUID | None = None,
) -> DelayedMessage:
    """What the delayed-message store keeps for a message due at ``due``, its headers stamped
    with ``NServiceBus.DeliverAt`` (``native_id``: its row id when delivered; default: the
    message id when it is a UUID, else a new one)."""
    headers[Headers.DELIVER_AT] = to_wire_time(due)
    if native_id is None:
        try:
            native_id = uuid.UUID(headers.get(Headers.MESSAGE_ID, ""))
        except ValueError:
            native_id = uuid.uuid4()
    return DelayedMessage(id=native_id, destination=str(destination), due=due,
                          headers=encode_headers(headers), body=body)


def as_delayed(address: QueueAddress, message: OutgoingMessage, due: datetime) -> DelayedMessage:
    """An outgoing message (already stamped by :func:`create_outgoing`) as a delayed one."""
    try:
        native_id = uuid.UUID(message.message_id)
    except ValueError:
        native_id = uuid.uuid4()
    return delayed_message(address, dict(message.headers), message.body, due,
                           native_id=native_id)


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
    due: datetime | None = None,
    hooks: Iterable[OutgoingHook] | None = None,
    destination: QueueAddress | None = None,
) -> OutgoingMessage:
    """Serialize ``message`` and set the standard headers of a send, publish or reply.

    ``correlation_id`` defaults to the message's own id (a message sent from outside any
    handler starts a correlation); handlers pass the incoming message's (see
    :class:`~endpoint_runtime.chain.context.HandlerContext`). A publish of a command raises
    :class:`ConfigurationError`. ``due``: a deferred message's due time, stamped as
    ``NServiceBus.DeliverAt``; ``hooks`` see the headers last (``destination``: the queue,
    for the hooks that want it).

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
    if due is not None:
        standard[Headers.DELIVER_AT] = to_wire_time(due)
    if headers:
        standard.update(headers)
    for hook in hooks or ():
        if getattr(hook, "wants_destination", False):
            cast("Callable[[MutableMapping[str, str], str | None], None]", hook)(
                standard, None if destination is None else str(destination))
        else:
            hook(standard)
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
