"""The saga a user writes: a class with a state Struct and handler methods.

Example::

    class OrderState(msgspec.Struct):
        order_id: str                            # set from the starting message
        placed: bool = False
        paid: bool = False

    @endpoint.saga
    class OrderFulfilment(Saga[OrderState]):
        correlation = "order_id"                 # the state field, column Correlation_order_id

        @starts                                  # OrderPlaced.order_id holds the value
        async def placed(self, message: OrderPlaced) -> None:
            self.state.placed = True
            await self.request_timeout(PaymentOverdue(), delay=timedelta(hours=1))

        @handles                                 # a timeout finds its instance by saga id
        async def overdue(self, message: PaymentOverdue) -> None:
            self.mark_as_complete()

A handler method takes ``(self, message)`` or ``(self, message, context)``; its message type
is the annotation of ``message``, and ``self.context`` is the message's context either way.
``@starts`` makes the message type one that creates an instance when none is found;
``@handles`` one that only reaches an existing instance; both work with or without
parentheses. The correlation is stated once, on the class: a message whose type has a field
of the correlation's name is looked up by it (a starting message must have one). Where the
names differ, ``correlate=`` names the message's field (or is a function of the message);
``@handles(correlate=None)`` finds the message by the saga-id headers of replies and timeouts
only, as a message without that field is. State fields without defaults are set when an
instance starts: the correlation field from its value, any other from the starting message's
field of the same name (every starting message type must have it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar, overload

import msgspec

from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.errors import EndpointRuntimeError
from endpoint_runtime.wire.messages import Headers

S = TypeVar("S", bound=msgspec.Struct)
F = TypeVar("F", bound=Callable[..., Any])

class _ByName:
    """The default of ``correlate=``: the message's field named as the saga's correlation,
    if its type has one (a starting message must)."""

    def __repr__(self) -> str:
        return "BY_NAME"


BY_NAME: Any = _ByName()
Correlate = str | Callable[[Any], Any] | None
"""A message field's name, a function of the message, or ``None`` (found by saga id only)."""

SAGA_HANDLER = "__saga_handler__"
"""The attribute ``@starts``/``@handles`` leave on a method: its :class:`HandlerMark`."""


class HandlerMark(msgspec.Struct, frozen=True):
    """What ``@starts``/``@handles`` said about a method."""

    starts: bool
    correlate: Any  # Correlate (a callable is no msgspec type)


@overload
def starts(method: F, /) -> F: ...


@overload
def starts(*, correlate: Correlate = BY_NAME) -> Callable[[F], F]: ...


def starts(method: F | None = None, /, *,
           correlate: Correlate = BY_NAME) -> F | Callable[[F], F]:
    """Mark a handler method whose message type starts the saga: when no instance has the
    message's correlation value, a new one is created (its correlation field set from it).
    Bare (``@starts``) or with ``correlate=`` (the message's field holding the value, when
    it is not named as the saga's correlation)."""
    if correlate is None:
        raise TypeError("@starts needs correlate=: a starting message must carry the value")
    decorate = _mark(HandlerMark(starts=True, correlate=correlate))
    return decorate if method is None else decorate(method)


@overload
def handles(method: F, /) -> F: ...


@overload
def handles(*, correlate: Correlate = BY_NAME) -> Callable[[F], F]: ...


def handles(method: F | None = None, /, *,
            correlate: Correlate = BY_NAME) -> F | Callable[[F], F]:
    """Mark a handler method whose message type reaches an existing instance only; when none
    is found the endpoint's saga-not-found handling runs (default: logged and consumed).
    By default the message is looked up by its field named as the saga's correlation, if it
    has one, else by saga id only (replies, timeouts); ``correlate=None``: by saga id only."""
    decorate = _mark(HandlerMark(starts=False, correlate=correlate))
    return decorate if method is None else decorate(method)


def _mark(mark: HandlerMark) -> Callable[[F], F]:
    def decorate(method: F) -> F:
        setattr(method, SAGA_HANDLER, mark)
        return method

    return decorate


class Saga(Generic[S]):
    """Base class of sagas: ``Saga[StateStruct]``; see the module docstring.

    Class attributes: ``correlation`` (the state field whose value maps messages to one
    instance; ``None``: found by saga id only). In a handler method, ``self.state`` is the
    instance's state (change it in place or assign a new one), ``self.saga_id`` its id and
    ``self.is_new`` whether this message created it.
    """

    correlation: ClassVar[str | None] = None

    state: S
    saga_id: uuid.UUID
    is_new: bool
    originator: str | None
    """The ``ReplyToAddress`` of the message that started the instance."""
    original_message_id: str | None
    completed: bool
    context: HandlerContext
    """The context of the message being handled (also in methods that do not take it)."""

    def mark_as_complete(self) -> None:
        """End the instance once the message's work commits: its row is deleted, later
        messages find no instance (timeouts are ignored, others are "not found")."""
        self.completed = True

    @overload
    async def request_timeout(self, message: msgspec.Struct, /, *,
                              delay: timedelta | None = None,
                              at: datetime | None = None) -> str: ...

    @overload
    async def request_timeout(self, context: HandlerContext, message: msgspec.Struct, /, *,
                              delay: timedelta | None = None,
                              at: datetime | None = None) -> str: ...

    async def request_timeout(self, *arguments: Any, delay: timedelta | None = None,
                              at: datetime | None = None) -> str:
        """Send ``message`` to this endpoint after ``delay`` (or at ``at``), through the
        delayed-message store, to come back to this instance (by saga id); a handler of its
        type runs then, unless the instance completed (then it is ignored). Returns its id.
        ``request_timeout(message, ...)``; the earlier ``(context, message, ...)`` works too."""
        if (delay is None) == (at is None):
            raise TypeError("request_timeout needs delay= or at=, not both")
        context, message = self._context_and(arguments, "request_timeout")
        return await context.send_local(
            message, delay=delay, deliver_at=at,
            headers={Headers.SAGA_ID: str(self.saga_id), Headers.SAGA_TYPE: self.type_name(),
                     Headers.IS_SAGA_TIMEOUT: "True"})

    @overload
    async def reply_to_originator(self, message: msgspec.Struct, /) -> str: ...

    @overload
    async def reply_to_originator(self, context: HandlerContext,
                                  message: msgspec.Struct, /) -> str: ...

    async def reply_to_originator(self, *arguments: Any) -> str:
        """Reply ``message`` to the endpoint that sent the message that started the instance,
        correlated by that message's id (as NServiceBus's ``ReplyToOriginator``).
        ``reply_to_originator(message)``; the earlier ``(context, message)`` works too."""
        context, message = self._context_and(arguments, "reply_to_originator")
        if not self.originator:
            raise ValueError(f"saga {self.type_name()} {self.saga_id} has no originator "
                             f"(its starting message had no {Headers.REPLY_TO_ADDRESS})")
        headers = ({Headers.CORRELATION_ID: self.original_message_id}
                   if self.original_message_id else None)
        return await context.reply(message, destination=self.originator, headers=headers)

    def _context_and(self, arguments: tuple[Any, ...],
                     method: str) -> tuple[HandlerContext, msgspec.Struct]:
        """``(message,)`` with this message's context, or ``(context, message)``."""
        if len(arguments) == 2 and isinstance(arguments[0], HandlerContext):
            return arguments[0], arguments[1]
        if len(arguments) == 1 and isinstance(arguments[0], msgspec.Struct):
            context = getattr(self, "context", None)
            if context is None:
                raise EndpointRuntimeError(
                    f"{method}() outside a handler method of the saga: no message context")
            return context, arguments[0]
        raise TypeError(f"{method} takes (message) or (context, message)")

    @classmethod
    def type_name(cls) -> str:
        """The ``NServiceBus.SagaType`` of this saga: ``module.QualifiedName``."""
        return f"{cls.__module__}.{cls.__qualname__}"
