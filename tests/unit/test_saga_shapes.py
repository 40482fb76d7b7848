"""The short saga form (no database): the correlation stated once, a state without sentinel
defaults, ``@starts``/``@handles`` without parentheses, methods without the context, and
timeouts and replies that do not take it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec
import pytest

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.sagas import Saga, handles, starts
from endpoint_runtime.sagas.testing import invoke_saga
from endpoint_runtime.wire.messages import Headers


class OrderPlaced(msgspec.Struct):
    order_id: str
    customer: str


class PaymentReceived(msgspec.Struct):
    order_id: str


class PaymentOverdue(msgspec.Struct):
    pass


class Shipped(msgspec.Struct):
    order: str


class OrderState(msgspec.Struct):
    order_id: str  # the correlation: set from the starting message's value
    customer: str  # no default either: set from OrderPlaced.customer
    paid: bool = False


class OrderDone(msgspec.Struct):
    order_id: str


class Fulfilment(Saga[OrderState]):
    correlation = "order_id"

    @starts
    async def placed(self, message: OrderPlaced) -> None:
        await self.request_timeout(PaymentOverdue(), delay=timedelta(hours=1))

    @handles
    async def paid(self, message: PaymentReceived) -> None:  # found by its order_id
        self.state.paid = True
        await self.reply_to_originator(OrderDone(self.state.order_id))
        self.mark_as_complete()

    @handles()
    async def overdue(self, message: PaymentOverdue, context: HandlerContext) -> None:
        assert context is self.context  # the longer form still works
        self.mark_as_complete()


def test_the_short_form_registers_with_the_correlation_stated_once() -> None:
    endpoint = Endpoint("sales")
    endpoint.saga(Fulfilment)
    [definition] = endpoint.sagas.definitions
    handlers = definition.handlers
    assert handlers[OrderPlaced].starts
    assert handlers[OrderPlaced].correlation_value(OrderPlaced("o-1", "c")) == "o-1"
    assert handlers[PaymentReceived].correlation_value(PaymentReceived("o-1")) == "o-1"
    assert handlers[PaymentOverdue].correlate is None  # no such field: by saga id only
    assert {t: h.takes_context for t, h in handlers.items()} == {
        OrderPlaced: False, PaymentReceived: False, PaymentOverdue: True}


def test_a_start_fills_the_state_from_the_message_and_requests_its_timeout() -> None:
    saga, context = asyncio.run(invoke_saga(Fulfilment, OrderPlaced("o-1", "ada")))
    assert saga.state == OrderState(order_id="o-1", customer="ada")
    [timeout] = context.deferred
    assert timeout.message == PaymentOverdue()
    assert timeout.headers[Headers.SAGA_ID] == str(saga.saga_id)
    assert timeout.headers[Headers.IS_SAGA_TIMEOUT] == "True"


def test_a_reply_to_the_originator_needs_no_context() -> None:
    saga, context = asyncio.run(invoke_saga(
        Fulfilment, PaymentReceived("o-1"), state=OrderState("o-1", "ada"),
        originator="web"))
    assert saga.completed
    assert [(r.message, r.destination) for r in context.replied] == [(OrderDone("o-1"), "web")]


def test_a_starting_message_without_the_correlation_field_is_named_at_registration() -> None:
    class Wrong(Saga[OrderState]):
        correlation = "order_id"

        @starts
        async def shipped(self, message: Shipped) -> None: ...

    with pytest.raises(ConfigurationError, match=r"Shipped has no field 'order_id': name the "
                                                  r"field that holds it with @starts\(correlate"):
        Endpoint("sales").saga(Wrong)


def test_handles_correlate_none_finds_by_saga_id_only() -> None:
    class ById(Saga[OrderState]):
        correlation = "order_id"

        @starts
        async def placed(self, message: OrderPlaced) -> None: ...

        @handles(correlate=None)
        async def paid(self, message: PaymentReceived) -> None: ...

    endpoint = Endpoint("sales")
    endpoint.saga(ById)
    [definition] = endpoint.sagas.definitions
    assert definition.handlers[PaymentReceived].correlate is None
