"""msgspec JSON bodies and message type names.

A message type is a ``msgspec.Struct``. Its wire name (header
``NServiceBus.EnclosedMessageTypes``) defaults to ``module.QualName``; set
``__message_type_name__`` on the class to choose it, e.g. to match a .NET type::

    class PlaceOrder(msgspec.Struct):
        __message_type_name__ = "Sales.Messages.PlaceOrder"
        order_id: str

The name belongs to the class that sets it: a subclass that sets none has its own
``module.QualName``, never its base's name (two types under one name could not both be handled,
and a subscriber to the base would be subscribed to the subclass alone).
"""

from __future__ import annotations

from typing import Any

import msgspec

from endpoint_runtime.errors import (
    ConfigurationError,
    MessageDecodeError,
    UnknownMessageTypeError,
)

_encoder = msgspec.json.Encoder()


def message_type_name(message_type: type) -> str:
    """The wire name of a message type: its own ``__message_type_name__``, else
    ``module.QualName`` (an inherited ``__message_type_name__`` does not count)."""
    explicit = vars(message_type).get("__message_type_name__")
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit:
            raise ConfigurationError(f"{message_type!r}.__message_type_name__ must be a string")
        return explicit
    return f"{message_type.__module__}.{message_type.__qualname__}"


def encode_body(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def enclosed_type_names(header: str) -> list[str]:
    """Type names in an ``EnclosedMessageTypes`` header, most specific first.

    NServiceBus writes assembly-qualified names separated by ``;``
    (``Sales.PlaceOrder, Sales, Version=1.0.0.0, ...``); the part before the first comma is
    the type's full name.
    """
    return [part.split(",", 1)[0].strip() for part in header.split(";") if part.strip()]


class MessageTypes:
    """Known message types by wire name, each with its cached decoder."""

    def __init__(self) -> None:
        self._by_name: dict[str, type[msgspec.Struct]] = {}
        self._resolved: dict[str, type[msgspec.Struct]] = {}
        self._decoders: dict[type[msgspec.Struct], msgspec.json.Decoder[Any]] = {}

    def add(self, message_type: type[msgspec.Struct]) -> str:
        if not (isinstance(message_type, type) and issubclass(message_type, msgspec.Struct)):
            raise ConfigurationError(f"{message_type!r} is not a msgspec.Struct subclass")
        name = message_type_name(message_type)
        known = self._by_name.get(name)
        if known is not None and known is not message_type:
            raise ConfigurationError(
                f"message type name {name!r} is used by both {known!r} and {message_type!r}"
            )
        self._by_name[name] = message_type
        self._decoders[message_type] = msgspec.json.Decoder(message_type)
        return name

    def __contains__(self, message_type: object) -> bool:
        return message_type in self._decoders

    def resolve(self, enclosed_types: str) -> type[msgspec.Struct]:
        """The registered type named first in an ``EnclosedMessageTypes`` header."""
        cached = self._resolved.get(enclosed_types)
        if cached is not None:
            return cached
        for name in enclosed_type_names(enclosed_types):
            found = self._by_name.get(name)
            if found is not None:
                # Bounded by count and by size: headers come from outside, and a key is the
                # whole header (a 100 KB header is resolved each time, never kept).
                if len(self._resolved) < 1_000 and len(enclosed_types) <= 2_048:
                    self._resolved[enclosed_types] = found
                return found
        raise UnknownMessageTypeError(enclosed_types)

    def decode(self, message_type: type[msgspec.Struct], body: bytes) -> msgspec.Struct:
        decoder = self._decoders.get(message_type)
        if decoder is None:
            decoder = self._decoders[message_type] = msgspec.json.Decoder(message_type)
        try:
            result: msgspec.Struct = decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise MessageDecodeError(message_type_name(message_type), body, exc) from exc
        return result
