"""The saga step of the chain, and the session it opens for each message.

The step sits between the audit step and the handler invocation. Before the handlers it puts
a :class:`SagaSession` in ``context.items`` and an outgoing hook on the message: every message a
saga handler sends carries ``NServiceBus.OriginatingSagaId``/``OriginatingSagaType`` (a reply to
it comes back with ``NServiceBus.SagaId``). The saga handlers themselves
(:mod:`endpoint_runtime.sagas.invocation`) run among the endpoint's handlers, load and save the
instance on the handlers' connection (the mode's transaction) and note what they did in the
session; after them the step leaves the audit headers (``NServiceBus.InvokedSagas``,
``EndpointRuntime.SagaChanges``) for the audit copy.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping

import msgspec

from endpoint_runtime.messages import Headers
from endpoint_runtime.pipeline import IncomingContext, Next
from endpoint_runtime.steps import AUDIT_HEADERS

SESSION = "saga_session"
"""``context.items[SESSION]``: the message's :class:`SagaSession`."""


class InvokedSaga(msgspec.Struct):
    """A saga instance a message reached, and what became of it: ``New``, ``Updated`` or
    ``Completed`` (a new instance completed at once: ``New,Completed``)."""

    type_name: str
    saga_id: uuid.UUID
    change: str = "Updated"


class SagaSession:
    """What the saga handlers of one message did (``invoked``) and the instance running now
    (``active``), whose id the outgoing messages carry."""

    __slots__ = ("active", "invoked")

    def __init__(self) -> None:
        self.active: InvokedSaga | None = None
        self.invoked: list[InvokedSaga] = []

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
    """Opens the message's :class:`SagaSession`; after the handlers, its audit headers."""

    name = "sagas"

    async def __call__(self, context: IncomingContext, next: Next) -> None:
        session = context.items[SESSION] = SagaSession()
        context.on_outgoing(session.stamp)
        await next(context)
        if session.invoked:
            context.items[AUDIT_HEADERS] = session.audit_headers()
