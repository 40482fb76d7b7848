"""Commands and events: what a message type is declared to be, and what that allows.

NServiceBus tells commands from events by conventions, by default the marker interfaces
``ICommand`` and ``IEvent``. Here the markers are the classes :class:`Command` and
:class:`Event`, mixed into a ``msgspec.Struct``::

    class PlaceOrder(msgspec.Struct, Command):
        order_id: str

    class OrderPlaced(msgspec.Struct, Event):
        order_id: str

A command is sent to the one endpoint that owns it: it cannot be published, and an endpoint
does not subscribe to it. An event is published. A type that declares neither is a plain
message (NServiceBus's ``IMessage``): it may be sent or published, and an endpoint that handles
it subscribes to it, as every handled type was before the markers existed. The markers are
not message types themselves and never appear in a wire name or a topic; a subclass of a
command is a command, of an event an event.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TypeVar

from endpoint_runtime.errors import ConfigurationError

T = TypeVar("T", bound=type)


class Command:
    """Marker: a message type that is a command (sent to its owner, never published)."""

    __slots__ = ()


class Event:
    """Marker: a message type that is an event (published to its subscribers)."""

    __slots__ = ()


class MessageKind(enum.StrEnum):
    """What a message type is declared to be."""

    COMMAND = "command"
    EVENT = "event"
    MESSAGE = "message"
    """Neither declared: may be sent or published (NServiceBus's plain ``IMessage``)."""


def kind_of(message_type: type) -> MessageKind:
    """The kind a message type declares through the :class:`Command` and :class:`Event`
    markers (its own or a base's).

    Raises:
        ConfigurationError: the type is both a command and an event.
    """
    command = issubclass(message_type, Command)
    event = issubclass(message_type, Event)
    if command and event:
        raise ConfigurationError(
            f"message type {_name(message_type)} is declared both a command and an event"
        )
    if command:
        return MessageKind.COMMAND
    return MessageKind.EVENT if event else MessageKind.MESSAGE


def check_publishable(message_type: type) -> None:
    """Raise :class:`ConfigurationError` for a command: commands are sent, not published."""
    if kind_of(message_type) is MessageKind.COMMAND:
        raise ConfigurationError(
            f"cannot publish {_name(message_type)}: it is a command; send it to the endpoint "
            "that owns it instead (commands have one receiver, events are published)"
        )


def check_subscribable(message_type: type) -> None:
    """Raise :class:`ConfigurationError` for a command: no endpoint subscribes to one."""
    if kind_of(message_type) is MessageKind.COMMAND:
        raise ConfigurationError(
            f"cannot subscribe to {_name(message_type)}: it is a command; commands are sent "
            "to the endpoint that owns them, never published"
        )


def subscribable(message_types: Iterable[T]) -> list[T]:
    """The types an endpoint subscribes to at start: every handled type but commands."""
    return [t for t in message_types if kind_of(t) is not MessageKind.COMMAND]


def commands(message_types: Iterable[T]) -> list[T]:
    """The commands among ``message_types`` (their stored subscriptions are pruned at start)."""
    return [t for t in message_types if kind_of(t) is MessageKind.COMMAND]


def _name(message_type: type) -> str:
    return f"{message_type.__module__}.{message_type.__qualname__}"
