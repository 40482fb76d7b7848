"""Handler registry: message type -> handlers, in registration order.

The message type comes from the annotation of a handler's first parameter. Registration fails
at once, with a clear error, for anything that could not run later.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from endpoint_runtime.chain.recoverability.policy import RetryLimits
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.wire.message_kinds import kind_of
from endpoint_runtime.wire.serialization import MessageTypes

_ENDPOINTS_LIMITS = RetryLimits()
"""The limits of a handler registered without its own: the endpoint's (one shared value)."""

if typing.TYPE_CHECKING:
    from endpoint_runtime.chain.context import HandlerContext

Handler = Callable[[Any, "HandlerContext"], Awaitable[None]]


class HandlerRegistry:
    """Handlers by message type, plus the message types they need decoded."""

    def __init__(self) -> None:
        self._handlers: dict[type[msgspec.Struct], list[Handler]] = {}
        self._limits: dict[Handler, RetryLimits] = {}
        self.message_types = MessageTypes()

    def register(
        self,
        handler: Handler,
        message_type: type[msgspec.Struct] | None = None,
        limits: RetryLimits | None = None,
    ) -> None:
        """Add ``handler`` for ``message_type`` (default: its first parameter's annotation).

        ``limits`` overrides the endpoint's retry counts when this handler fails.
        """
        if not inspect.iscoroutinefunction(handler):
            raise ConfigurationError(
                f"handler {_name(handler)} must be an async function (async def)"
            )
        if message_type is None:
            message_type = message_type_of(handler)
        kind_of(message_type)  # a type declared both a command and an event fails here
        self.message_types.add(message_type)
        registered = self._handlers.setdefault(message_type, [])
        if handler in registered:
            raise ConfigurationError(
                f"handler {_name(handler)} is already registered for {message_type.__name__}"
            )
        registered.append(handler)
        if limits is not None:
            for name in ("immediate_retries", "delayed_retries"):
                value = getattr(limits, name)
                if value is not None and value < 0:
                    raise ConfigurationError(f"{name} of {_name(handler)} cannot be negative")
            self._limits[handler] = limits

    def limits_for(self, handler: Handler) -> RetryLimits:
        return self._limits.get(handler, _ENDPOINTS_LIMITS)

    def handlers_for(self, message_type: type[msgspec.Struct]) -> list[Handler]:
        return self._handlers.get(message_type, [])

    @property
    def handled_types(self) -> list[type[msgspec.Struct]]:
        return list(self._handlers)

    def __len__(self) -> int:
        return sum(len(h) for h in self._handlers.values())


def message_type_of(handler: Handler) -> type[msgspec.Struct]:
    """The msgspec Struct type annotated on the handler's first parameter."""
    parameters = list(inspect.signature(handler).parameters.values())
    if len(parameters) != 2:
        raise ConfigurationError(
            f"handler {_name(handler)} must take two parameters: (message, context)"
        )
    try:
        hints = typing.get_type_hints(handler)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the annotations of handler {_name(handler)}: {exc}"
        ) from exc
    annotation = hints.get(parameters[0].name)
    if annotation is None:
        raise ConfigurationError(
            f"handler {_name(handler)}: annotate the first parameter with the message type"
        )
    if not (isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)):
        raise ConfigurationError(
            f"handler {_name(handler)}: message type {annotation!r} is not a msgspec.Struct"
        )
    return annotation


def _name(handler: object) -> str:
    module = getattr(handler, "__module__", "?")
    return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"
