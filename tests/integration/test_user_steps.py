"""User steps in every transaction mode (real PostgreSQL, each mode's receive strategy, no Ray):
an outgoing hook that copies a tenant header to every message a handler sends, a step that
raises (a handler failure, retried as one, then the error queue), a step that consumes the
message (it does not call ``next``: the message is gone, no handler ran; with the outbox it is
recorded, so a copy of it is acknowledged without running the steps again)."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.chain.outbox.storage import OutboxStorage
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.pipeline import IncomingContext, Next
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.transactions.outbox_receive import OutboxStrategy
from endpoint_runtime.wire.messages import ErrorHeaders
from handlers_examples.tenancy import TENANT_HEADER as TENANT
from handlers_examples.tenancy import copy_tenant
from tests.support.draining import drain, received_all
from tests.support.modes import MODES


class Order(msgspec.Struct):
    n: int


class Invoice(msgspec.Struct):
    n: int




class Seen:
    """What the handler and the steps saw."""

    def __init__(self) -> None:
        self.handled: list[int] = []
        self.stepped: list[int] = []

    def step(self, context: IncomingContext) -> int:
        """Note that a step saw the message; its order number."""
        n = msgspec.json.decode(context.transport_message.body, type=Order).n
        self.stepped.append(n)
        return n


def endpoint_in(mode: str, seen: Seen, step: Any) -> Endpoint:
    retries = {} if mode == "none" else {"immediate_retries": 1, "delayed_retries": 0}
    endpoint = Endpoint("orders", **MODES[mode], **retries)

    @endpoint.handler
    async def bill(message: Order, context: HandlerContext) -> None:
        seen.handled.append(message.n)
        await context.send(Invoice(message.n), destination="invoices")

    endpoint.add_step("under_test", step)
    return endpoint


async def prepare(transport: PostgresTransport, endpoint: Endpoint) -> None:
    for queue in ("orders", "invoices", "error"):
        await transport.create_queue(queue)
    if endpoint.settings.outbox is not None:
        async with transport.pool.acquire() as connection:
            await OutboxStorage.for_settings(endpoint.address, endpoint.settings).setup(connection)


async def send(transport: PostgresTransport, n: int, *, message_id: str | None = None) -> str:
    outgoing = create_outgoing(Order(n), message_id=message_id,
                               headers={TENANT: f"tenant-{n}"})
    await transport.send("orders", outgoing)
    return outgoing.message_id


@pytest.mark.parametrize("mode", MODES)
async def test_a_step_adds_a_header_to_every_message_the_handlers_send(
    transport: PostgresTransport, mode: str,
) -> None:
    seen = Seen()
    endpoint = endpoint_in(mode, seen, copy_tenant)  # the examples' step
    await prepare(transport, endpoint)
    for n in (1, 2, 3):
        await send(transport, n)

    await drain(transport, endpoint)

    invoices = await received_all(transport, "invoices")
    assert sorted((msgspec.json.decode(m.body, type=Invoice).n, m.headers[TENANT])
                  for m in invoices) == [(1, "tenant-1"), (2, "tenant-2"), (3, "tenant-3")]
    assert sorted(seen.handled) == [1, 2, 3]
    assert await transport.depth("orders") == 0


@pytest.mark.parametrize("mode", MODES)
async def test_a_step_that_raises_fails_the_attempt_like_a_handler(
    transport: PostgresTransport, mode: str,
) -> None:
    seen = Seen()

    async def refuse(context: IncomingContext, next: Next) -> None:
        if seen.step(context) == 2:
            raise PermissionError("tenant-2 may not order")
        await next(context)

    endpoint = endpoint_in(mode, seen, refuse)
    await prepare(transport, endpoint)
    for n in (1, 2, 3):
        await send(transport, n)

    await drain(transport, endpoint)

    attempts = 1 if mode == "none" else 2  # no retry where the message cannot come back
    assert sorted(seen.stepped) == sorted([1, 3] + [2] * attempts)
    assert sorted(seen.handled) == [1, 3]
    failed = await received_all(transport, "error")
    assert [(m.headers[TENANT], m.headers[ErrorHeaders.EXCEPTION_TYPE]) for m in failed] == [
        ("tenant-2", "builtins.PermissionError")]
    invoices = await received_all(transport, "invoices")
    assert sorted(msgspec.json.decode(m.body, type=Invoice).n for m in invoices) == [1, 3]
    assert await transport.depth("orders") == 0


@pytest.mark.parametrize("mode", MODES)
async def test_a_step_that_does_not_call_next_consumes_the_message(
    transport: PostgresTransport, mode: str,
) -> None:
    seen = Seen()

    async def skip_even(context: IncomingContext, next: Next) -> None:
        if seen.step(context) % 2 == 0:
            return  # consumed: the handlers do not run
        await next(context)

    endpoint = endpoint_in(mode, seen, skip_even)
    await prepare(transport, endpoint)
    for n in (1, 2, 3):
        await send(transport, n)

    await drain(transport, endpoint)

    assert sorted(seen.stepped) == [1, 2, 3]
    assert sorted(seen.handled) == [1, 3]
    invoices = await received_all(transport, "invoices")
    assert sorted(msgspec.json.decode(m.body, type=Invoice).n for m in invoices) == [1, 3]
    assert await received_all(transport, "error") == []
    assert await transport.depth("orders") == 0


async def test_with_the_outbox_a_consumed_message_is_recorded_and_its_copy_not_run_again(
    transport: PostgresTransport,
) -> None:
    seen = Seen()

    async def skip(context: IncomingContext, next: Next) -> None:
        seen.step(context)

    endpoint = endpoint_in("outbox", seen, skip)
    await prepare(transport, endpoint)
    message_id = str(uuid.uuid4())
    await send(transport, 7, message_id=message_id)
    await drain(transport, endpoint)
    storage = OutboxStorage.for_settings(endpoint.address, endpoint.settings)
    record = await transport.pool.fetchrow(
        f"SELECT dispatched, operations FROM {storage.table.qualified} WHERE message_id = $1",
        message_id)
    assert record is not None
    assert record["dispatched"] is True

    await send(transport, 7, message_id=message_id)  # a copy: the sender retried
    strategy = await drain(transport, endpoint)
    assert isinstance(strategy, OutboxStrategy)

    assert seen.stepped == [7]  # the copy did not reach the step again
    assert seen.handled == []
    assert strategy.duplicates == 1
    assert await transport.depth("orders") == 0

