"""The saga step of the chain, and the session it opens for each message.

The step sits between the audit step and the handler invocation. Before the handlers it puts
a :class:`SagaSession` in ``context.items`` and an outgoing hook on the message: every message a
saga handler sends carries ``NServiceBus.OriginatingSagaId``/``OriginatingSagaType`` (a reply to
it comes back with ``NServiceBus.SagaId``). The saga handlers themselves
(:mod:`endpoint_runtime.chain.sagas.invocation`) run among the endpoint's handlers, load and save
the instance on the handlers' connection (the mode's transaction) and note what they did in the
session; after them the step leaves the audit headers (``NServiceBus.InvokedSagas``,
``EndpointRuntime.SagaChanges``) for the audit copy or, when no saga found or made an instance
for the message, runs the saga-not-found hooks once.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import msgspec
import structlog

from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.chain.pipeline import IncomingContext, Next
from endpoint_runtime.chain.steps import AUDIT_HEADERS
from endpoint_runtime.wire.messages import Headers

log = structlog.get_logger("endpoint_runtime.sagas")

SESSION = "saga_session"
"""``context.items[SESSION]``: the message's :class:`SagaSession`."""

NotFoundHook = Callable[[Any, HandlerContext], Awaitable[None]]
"""``async def hook(message, context)``: no saga found or made an instance for the message."""


class InvokedSaga(msgspec.Struct):
    """A saga instance a message reached, and what became of it: ``New``, ``Updated`` or
    ``Completed`` (a new instance completed at once: ``New,Completed``)."""

    type_name: str
    saga_id: uuid.UUID
    change: str = "Updated"


class SagaSession:
    """What the saga handlers of one message did (``invoked``), the instance running now
    (``active``), whose id the outgoing messages carry, and the sagas that found no instance
    for it (``missed``, with the message and context to run the not-found hooks with)."""

    __slots__ = ("active", "invoked", "missed", "missed_message")

    def __init__(self) -> None:
        self.active: InvokedSaga | None = None
        self.invoked: list[InvokedSaga] = []
        self.missed: list[str] = []
        self.missed_message: tuple[Any, HandlerContext] | None = None

    def not_found(self, type_name: str, message: Any, context: HandlerContext) -> None:
        """Note that the saga ``type_name`` found no instance for ``message``."""
        self.missed.append(type_name)
        self.missed_message = (message, context)

    def stamp(self, headers: MutableMapping[str, str]) -> None:
        """The outgoing hook: a message sent by a saga handler names its instance."""
        active = self.active
        if active is not None:
            headers.setdefault(Headers.ORIGINATING_SAGA_ID, str(active.saga_id))
            headers.setdefault(Headers.ORIGINATING_SAGA_TYPE, active.type_name)

    def audit_headers(self) -> dict[str, str]:
        return {
            Headers.INVOKED_SAGAS: ";".join(f"{s.type_name}:{s.saga_id}" for s in self.invoked),
            Headers.SAGA_CHANGES: ";".join(f"{s.type_name}:{s.saga_id}:{s.change}"
                                           for s in self.invoked),
        }


class SagaStep:
    """Opens the message's :class:`SagaSession`; after the handlers, when no saga found or
    made an instance for the message but some looked, the saga-not-found hooks (once; by
    default ``saga_not_found`` is logged and the message consumed), else the audit headers."""

    name = "sagas"

    def __init__(self, not_found_hooks: Sequence[NotFoundHook] = ()) -> None:
        self.not_found_hooks = not_found_hooks

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        session = context.items[SESSION] = SagaSession()
        context.on_outgoing(session.stamp)
        await next(context)
        if session.invoked:
            context.items[AUDIT_HEADERS] = session.audit_headers()
        elif session.missed_message is not None:
            await self._not_found(session, session.missed_message)

    async def _not_found(self, session: SagaSession,
                         missed: tuple[Any, HandlerContext]) -> None:
        message, handler_context = missed
        if not self.not_found_hooks:
            log.info("saga_not_found", saga_types=session.missed,
                     message_type=type(message).__name__)
            return
        for hook in self.not_found_hooks:
            await hook(message, handler_context)
