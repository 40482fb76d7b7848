"""Saga endpoints the saga tests drive (integration, without Ray) and deploy (e2e, on Ray).

``OrderSaga``: placed and paid in any order (both start it), shipped when both came (then
complete), ``Bump`` counts on a live instance only, ``Overdue`` (a timeout) cancels; each
effect is a message in ``shipments``. ``Tally``: many starters of one key, each adding its
``n``; a ``hold`` key waits on an advisory lock the test holds, between the look-up and the
save, so that concurrent starters race on the correlation index for certain.

Both are written in the short form (docs/sagas.md): the correlation stated once, on the class;
states without sentinel defaults; bare ``@starts``/``@handles``; methods without the context
(``self.context``); timeouts and replies without it; sends by route.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.sagas import Saga, handles, starts
from tests.support.modes import MODES

HOLD_KEY = 3232
"""The advisory lock ``Tally`` and ``Bump`` wait on (shared) when asked to: the test holds it."""


class Placed(msgspec.Struct):
    order_id: str
    timeout_s: float | None = None
    ask_payment: bool = False


class Paid(msgspec.Struct):
    order_id: str


class Bump(msgspec.Struct):
    order_id: str
    hold: bool = False


class Overdue(msgspec.Struct):
    order_id: str


class Ship(msgspec.Struct):
    order_id: str
    bumps: int = 0


class Cancelled(msgspec.Struct):
    order_id: str


class AskPayment(msgspec.Struct):
    order_id: str


class PaymentAccepted(msgspec.Struct):
    reference: str


class OrderState(msgspec.Struct):
    order_id: str
    placed: bool = False
    paid: bool = False
    bumps: int = 0
    reference: str = ""


async def hold(context: HandlerContext) -> None:
    await context.connection.execute("SELECT pg_advisory_xact_lock_shared($1)", HOLD_KEY)


class OrderSaga(Saga[OrderState]):
    correlation = "order_id"  # stated once: each message's order_id holds the value

    @starts
    async def placed(self, message: Placed) -> None:
        self.state.placed = True
        if message.timeout_s is not None:
            await self.request_timeout(Overdue(message.order_id),
                                       delay=timedelta(seconds=message.timeout_s))
        if message.ask_payment:
            await self.context.send(AskPayment(message.order_id))  # by route: payments
        await self.ship_when_ready()

    @starts
    async def paid(self, message: Paid) -> None:
        self.state.paid = True
        await self.ship_when_ready()

    @handles
    async def bump(self, message: Bump) -> None:
        if message.hold:
            await hold(self.context)
        self.state.bumps += 1

    @handles  # a timeout: found by its saga id
    async def overdue(self, message: Overdue) -> None:
        await self.context.send(Cancelled(self.state.order_id))
        self.mark_as_complete()

    @handles  # the reply to AskPayment: no order_id, found by saga id
    async def accepted(self, message: PaymentAccepted) -> None:
        self.state.reference = message.reference

    async def ship_when_ready(self) -> None:
        if self.state.placed and self.state.paid:
            await self.context.send(Ship(self.state.order_id, self.state.bumps))
            await self.reply_to_originator(Ship(self.state.order_id))
            self.mark_as_complete()


class Add(msgspec.Struct):
    key: str
    n: int
    hold: bool = False


class TallyState(msgspec.Struct):
    key: str
    seen: list[int] = msgspec.field(default_factory=list)


class Tally(Saga[TallyState]):
    correlation = "key"

    @starts
    async def add(self, message: Add) -> None:
        if message.hold:
            await hold(self.context)
        self.state.seen.append(message.n)




ROUTES: dict[type, str] = {Ship: "shipments", Cancelled: "shipments", AskPayment: "payments"}
"""Where the sagas' commands go (an endpoint's ``route``; ``invoke_saga(routes=ROUTES)``)."""


def saga_endpoint(mode: str = "atomic", *, name: str = "fulfilment",
                  concurrency: str = "optimistic", **overrides: Any) -> Endpoint:
    """An endpoint of ``OrderSaga`` and ``Tally`` in ``mode`` (see :data:`MODES`)."""
    retries = {} if mode == "none" else {"immediate_retries": 5, "delayed_retries": 0}
    endpoint = Endpoint(name, **{**MODES[mode], **retries, **overrides})
    for message_type, queue in ROUTES.items():
        endpoint.route(message_type, to=queue)
    endpoint.saga(OrderSaga, concurrency=concurrency)
    endpoint.saga(Tally, concurrency=concurrency)
    return endpoint


# Deployed by the e2e tests (receivers import them by path). Up to 8 messages race for one
# instance there: one wins each round, so a message may lose 7 times in a row.
DEPLOYED = {"max_concurrency": 8, "slots_per_receiver": 2, "immediate_retries": 10}
fulfilment = saga_endpoint(**DEPLOYED)
fulfilment_pessimistic = saga_endpoint(concurrency="pessimistic", **DEPLOYED)
