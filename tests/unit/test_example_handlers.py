"""The examples' handlers tested as docs/handlers.md shows, without a database or Ray: what
they decide before they touch the database, and what a handler that needs the database is
told when the test gave it none. (With a real connection: tests/integration/
test_example_handlers.py.)"""

from __future__ import annotations

from decimal import Decimal

import pytest

from endpoint_runtime.errors import EndpointRuntimeError
from endpoint_runtime.testing import invoke
from handlers_examples import notifications, sales
from handlers_examples.messages import OrderShipped, PlaceOrder, PointsAwarded


def order(**changes: object) -> PlaceOrder:
    fields: dict[str, object] = {"order_id": "o-1", "customer": "ada", "product": "mouse",
                                 "quantity": 2, "unit_price": Decimal("19.95"), **changes}
    return PlaceOrder(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("invalid", "reason"), [
    ({"quantity": 0}, "quantity must be positive"),
    ({"product": "toaster"}, "unknown product 'toaster'"),
])
async def test_sales_refuses_an_invalid_order_before_anything_is_written_or_sent(
    invalid: dict[str, object], reason: str
) -> None:
    with pytest.raises(sales.InvalidOrder, match=reason):
        await invoke(sales.endpoint, order(**invalid))
    # InvalidOrder is unrecoverable: straight to the error queue, no retries.
    assert sales.InvalidOrder in sales.endpoint.unrecoverable_exceptions


async def test_sales_needs_the_database_for_a_valid_order_and_says_so() -> None:
    with pytest.raises(EndpointRuntimeError, match=r"'sales' used context\.connection"):
        await invoke(sales.endpoint, order())


async def test_notifications_send_nothing_further() -> None:
    shipped = await invoke(notifications.endpoint, OrderShipped(
        order_id="o-1", shipment_id="s-1", customer="ada", carrier="DHL"))
    awarded = await invoke(notifications.endpoint,
                           PointsAwarded(order_id="o-1", customer="ada", points=39))
    assert shipped.recorded == []
    assert awarded.recorded == []
