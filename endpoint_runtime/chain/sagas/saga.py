"""The saga a user writes: a class with a state Struct and handler methods.

Example::

    class OrderState(msgspec.Struct):
        order_id: str = ""
        placed: bool = False
        paid: bool = False

    @endpoint.saga
    class OrderFulfilment(Saga[OrderState]):
        correlation = "order_id"                 # the state field, column Correlation_order_id

        @starts(correlate="order_id")            # this message's field holding the value
        async def placed(self, message: OrderPlaced, context: HandlerContext) -> None:
            self.state.placed = True
            await self.request_timeout(context, PaymentOverdue(), delay=timedelta(hours=1))
            await self.ship_when_ready(context)

        @handles()                               # a timeout finds its instance by saga id
        async def overdue(self, message: PaymentOverdue, context: HandlerContext) -> None:
            self.mark_as_complete()

A handler method takes ``(self, message, context)``; its message type is the annotation of
``message``. ``@starts`` makes the message type one that creates an instance when none is
found; ``@handles`` one that only reaches an existing instance. ``correlate`` names the
message's field (or is a function of the message) whose value is looked up in the saga's
``correlation`` state field; without it the message is found only by the saga-id headers of
replies and timeouts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.wire.messages import Headers

S = TypeVar("S", bound=msgspec.Struct)
F = TypeVar("F", bound=Callable[..., Any])

Correlate = str | Callable[[Any], Any] | None
"""A message field's name, a function of the message, or ``None`` (found by saga id only)."""

SAGA_HANDLER = "__saga_handler__"
"""The attribute ``@starts``/``@handles`` leave on a method: its :class:`HandlerMark`."""


class HandlerMark(msgspec.Struct, frozen=True):
    """What ``@starts``/``@handles`` said about a method."""

    starts: bool
    correlate: Any  # Correlate (a callable is no msgspec type)


def starts(*, correlate: Correlate) -> Callable[[F], F]:
    """Mark a handler method whose message type starts the saga: when no instance has the
    message's correlation value, a new one is created (its correlation field set from it)."""
    if correlate is None:
        raise TypeError("@starts needs correlate=: a starting message must carry the value")
    return _mark(HandlerMark(starts=True, correlate=correlate))


def handles(*, correlate: Correlate = None) -> Callable[[F], F]:
    """Mark a handler method whose message type reaches an existing instance only; when none
    is found the endpoint's saga-not-found handling runs (default: logged and consumed).
    Without ``correlate`` the message is found only by saga id (replies, timeouts)."""
    return _mark(HandlerMark(starts=False, correlate=correlate))


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

    def mark_as_complete(self) -> None:
        """End the instance once the message's work commits: its row is deleted, later
        messages find no instance (timeouts are ignored, others are "not found")."""
        self.completed = True

    async def request_timeout(
        self, context: HandlerContext, message: msgspec.Struct, *,
        delay: timedelta | None = None, at: datetime | None = None,
    ) -> str:
        """Send ``message`` to this endpoint after ``delay`` (or at ``at``), through the
        delayed-message store, to come back to this instance (by saga id); a handler of its
        type runs then, unless the instance completed (then it is ignored). Returns its id."""
        if (delay is None) == (at is None):
            raise TypeError("request_timeout needs delay= or at=, not both")
        return await context.send_local(
            message, delay=delay, deliver_at=at,
            headers={Headers.SAGA_ID: str(self.saga_id), Headers.SAGA_TYPE: self.type_name(),
                     Headers.IS_SAGA_TIMEOUT: "True"})

    async def reply_to_originator(self, context: HandlerContext,
                                  message: msgspec.Struct) -> str:
        """Reply ``message`` to the endpoint that sent the message that started the instance,
        correlated by that message's id (as NServiceBus's ``ReplyToOriginator``)."""
        if not self.originator:
            raise ValueError(f"saga {self.type_name()} {self.saga_id} has no originator "
                             f"(its starting message had no {Headers.REPLY_TO_ADDRESS})")
        headers = ({Headers.CORRELATION_ID: self.original_message_id}
                   if self.original_message_id else None)
        return await context.reply(message, destination=self.originator, headers=headers)

    @classmethod
    def type_name(cls) -> str:
        """The ``NServiceBus.SagaType`` of this saga: ``module.QualifiedName``."""
        return f"{cls.__module__}.{cls.__qualname__}"
