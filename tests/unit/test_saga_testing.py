"""``invoke_saga``: a saga's method run without a database or Ray, its state, completion,
sends, replies and timeouts read by the test."""

from __future__ import annotations

import uuid

import pytest

from endpoint_runtime import ConfigurationError
from endpoint_runtime.sagas.testing import invoke_saga
from endpoint_runtime.wire.messages import Headers
from tests.support.saga_endpoints import (
    ROUTES,
    Bump,
    OrderSaga,
    OrderState,
    Overdue,
    Paid,
    Placed,
    Ship,
)


async def test_a_starting_message_makes_a_new_instance_and_requests_its_timeout() -> None:
    saga, context = await invoke_saga(OrderSaga, Placed("o-1", timeout_s=60))
    assert saga.is_new
    assert not saga.completed
    assert saga.state == OrderState(order_id="o-1", placed=True)
    assert saga.originator == "test-client"
    (timeout,) = context.deferred
    assert timeout.message == Overdue("o-1")
    assert timeout.headers[Headers.SAGA_ID] == str(saga.saga_id)
    assert timeout.headers[Headers.IS_SAGA_TIMEOUT] == "True"
    assert timeout.due is not None


async def test_the_second_message_ships_replies_to_the_originator_and_completes() -> None:
    saga_id = uuid.uuid4()
    saga, context = await invoke_saga(
        OrderSaga, Paid("o-1"), state=OrderState(order_id="o-1", placed=True),
        saga_id=saga_id, originator="customers", routes=ROUTES)
    assert saga.completed
    assert saga.saga_id == saga_id
    assert [(s.message, s.destination) for s in context.sent] == [
        (Ship("o-1"), "shipments")]
    assert [(r.message, r.destination) for r in context.replied] == [
        (Ship("o-1"), "customers")]


async def test_a_message_that_does_not_start_the_saga_needs_a_state() -> None:
    with pytest.raises(ConfigurationError, match="does not start saga OrderSaga"):
        await invoke_saga(OrderSaga, Bump("o-1"))
    saga, _ = await invoke_saga(OrderSaga, Bump("o-1"), state=OrderState(order_id="o-1"))
    assert saga.state.bumps == 1
