"""Handler registry: message type -> handlers, in registration order, and how one is called.

The message type comes from the annotation of a handler's first parameter. A handler takes
``(message, context)`` or ``(message)`` alone (the context is then
:func:`~endpoint_runtime.chain.context.current_context`), and may return what it cascades: a
message, or a sequence of messages, sent inside the message's transaction as if the handler
had sent them (:func:`cascade`: events published, everything else sent by its route).
Registration fails at once, with a clear error, for anything that could not run later.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from endpoint_runtime.chain.recoverability.policy import RetryLimits
from endpoint_runtime.errors import ConfigurationError, HandlerReturnError
from endpoint_runtime.wire.message_kinds import MessageKind, kind_of
from endpoint_runtime.wire.serialization import MessageTypes

_ENDPOINTS_LIMITS = RetryLimits()
"""The limits of a handler registered without its own: the endpoint's (one shared value)."""

if typing.TYPE_CHECKING:
    from endpoint_runtime.chain.context import HandlerContext

Handler = Callable[..., Awaitable[Any]]
"""``async def handler(message: T, context: HandlerContext) -> None | Struct | Sequence[...]``,
or the same without ``context``."""


class HandlerRegistry:
    """Handlers by message type, plus the message types they need decoded."""

    def __init__(self) -> None:
        self._handlers: dict[type[msgspec.Struct], list[Handler]] = {}
        self._limits: dict[Handler, RetryLimits] = {}
        self._without_context: set[Handler] = set()
        """Handlers that take the message alone."""
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
                f"handler {handler_name(handler)} must be an async function (async def)"
            )
        takes_context = len(_parameters(handler)) == 2
        if message_type is None:
            message_type = message_type_of(handler)
        kind_of(message_type)  # a type declared both a command and an event fails here
        self.message_types.add(message_type)
        registered = self._handlers.setdefault(message_type, [])
        if handler in registered:
            raise ConfigurationError(
                f"handler {handler_name(handler)} is already registered for {message_type.__name__}"
            )
        registered.append(handler)
        if not takes_context:
            self._without_context.add(handler)
        if limits is not None:
            for name in ("immediate_retries", "delayed_retries"):
                value = getattr(limits, name)
                if value is not None and value < 0:
                    raise ConfigurationError(
                        f"{name} of {handler_name(handler)} cannot be negative")
            self._limits[handler] = limits

    def start(self, handler: Handler, message: Any, context: HandlerContext) -> Awaitable[Any]:
        """``handler`` called on ``message`` as it was declared (with or without the context):
        await it, then :func:`cascade` what it returned, if anything. A plain call, not a
        coroutine of its own: it adds no frame to every message's path."""
        if handler in self._without_context:
            return handler(message)
        return handler(message, context)

    def limits_for(self, handler: Handler) -> RetryLimits:
        return self._limits.get(handler, _ENDPOINTS_LIMITS)

    def handlers_for(self, message_type: type[msgspec.Struct]) -> list[Handler]:
        return self._handlers.get(message_type, [])

    @property
    def handled_types(self) -> list[type[msgspec.Struct]]:
        return list(self._handlers)

    def __len__(self) -> int:
        return sum(len(h) for h in self._handlers.values())


def _parameters(handler: Handler) -> list[inspect.Parameter]:
    parameters = list(inspect.signature(handler).parameters.values())
    if len(parameters) not in (1, 2) or any(
            p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters):
        raise ConfigurationError(
            f"handler {handler_name(handler)} must take (message, context) or (message) alone"
        )
    return parameters


async def cascade(context: HandlerContext, returned: object, handler: Handler) -> None:
    """Send what ``handler`` returned, in order, as the handler would have: an event is
    published, any other message sent by its route (``RoutingError`` without one).

    Raises:
        HandlerReturnError: ``returned`` is neither a message nor a sequence of messages
            (nothing of it is sent).
    """
    if isinstance(returned, msgspec.Struct):
        messages: list[msgspec.Struct] = [returned]
    elif isinstance(returned, list | tuple) and all(
            isinstance(item, msgspec.Struct) for item in returned):
        messages = list(returned)
    else:
        raise HandlerReturnError(
            f"handler {handler_name(handler)} returned {type(returned).__qualname__}: a handler "
            "returns None, a message (a msgspec.Struct) or a list or tuple of messages")
    for message in messages:
        if kind_of(type(message)) is MessageKind.EVENT:
            await context.publish(message)
        else:
            await context.send(message)


def message_type_of(handler: Handler) -> type[msgspec.Struct]:
    """The msgspec Struct type annotated on the handler's first parameter."""
    parameters = _parameters(handler)
    try:
        hints = typing.get_type_hints(handler)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the annotations of handler {handler_name(handler)}: {exc}"
        ) from exc
    annotation = hints.get(parameters[0].name)
    if annotation is None:
        raise ConfigurationError(
            f"handler {handler_name(handler)}: annotate the first parameter with the message type"
        )
    if not (isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)):
        raise ConfigurationError(
            f"handler {handler_name(handler)}: message type {annotation!r} is not a msgspec.Struct"
        )
    return annotation


def handler_name(handler: object) -> str:
    """``module.qualname`` of ``handler``, as logs and errors name it."""
    module = getattr(handler, "__module__", "?")
    return f"{module}.{getattr(handler, '__qualname__', repr(handler))}"
