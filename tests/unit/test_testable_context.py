"""endpoint_runtime.testing: the testable handler context records sends, replies, publishes
and deferrals with the real header logic, needs no database, and fails clearly where a
handler needs one (pure: no database, no Ray)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from endpoint_runtime import Command, Endpoint, Event, HandlerContext, Headers, MessageIntent
from endpoint_runtime.errors import ConfigurationError, EndpointRuntimeError
from endpoint_runtime.testing import TestableHandlerContext, invoke


class Charge(msgspec.Struct, Command):
    order_id: str


class Charged(msgspec.Struct, Event):
    order_id: str


class ExpressCharged(Charged):
    """Derived event: subscribers of Charged get it too."""


class Receipt(msgspec.Struct):
    order_id: str


endpoint = Endpoint("payments")
calls: list[str] = []


@endpoint.handler
async def charge(message: Charge, context: HandlerContext) -> None:
    calls.append("charge")
    await context.send(Receipt(message.order_id), destination="mail")
    await context.publish(ExpressCharged(message.order_id))
    await context.reply(Receipt(message.order_id))
    await context.send_local(Charge(message.order_id), delay=timedelta(minutes=5))


@endpoint.handler
async def audit_charge(message: Charge, context: HandlerContext) -> None:
    calls.append("audit")


async def test_invoke_records_every_kind_with_the_real_headers() -> None:
    calls.clear()
    context = await invoke(endpoint, Charge("o1"), subscribers={Charged: ["billing", "crm"]})

    assert calls == ["charge", "audit"]  # every handler of the type, in registration order
    incoming = context.transport_message.headers
    assert [r.intent for r in context.recorded] == [
        MessageIntent.SEND, MessageIntent.PUBLISH, MessageIntent.REPLY, MessageIntent.SEND]
    sent, deferred = context.sent
    assert sent.message == Receipt("o1")
    assert sent.destination == "mail"
    for record in context.recorded:
        assert record.headers[Headers.CORRELATION_ID] == incoming[Headers.MESSAGE_ID]
        assert record.headers[Headers.CONVERSATION_ID] == incoming[Headers.CONVERSATION_ID]
        assert record.headers[Headers.RELATED_TO] == incoming[Headers.MESSAGE_ID]
        assert record.headers[Headers.ORIGINATING_ENDPOINT] == "payments"
        assert record.headers[Headers.MESSAGE_ID] == record.message_id
    published = context.published[0]
    assert published.message == ExpressCharged("o1")
    assert published.destinations == ("billing", "crm")  # subscribers of the base type
    assert published.headers[Headers.ENCLOSED_MESSAGE_TYPES].count(";") == 1
    assert context.replied[0].destination == "test-client"
    assert context.deferred == [deferred]
    assert deferred.destination == "payments"
    assert deferred.due is not None
    assert timedelta(minutes=4) < deferred.due - datetime.now(UTC) <= timedelta(minutes=5)
    assert Headers.DELIVER_AT in deferred.headers


async def test_an_incoming_correlation_id_is_carried_and_a_publish_without_subscribers_kept(
) -> None:
    context = TestableHandlerContext(
        Charge("o2"), endpoint=endpoint, headers={Headers.CORRELATION_ID: "saga-7"})

    await context.publish(Charged("o2"))
    await context.send(Receipt("o2"), destination="ledger.entries")

    assert context.published[0].destinations == ()
    assert context.sent[0].destination == "ledger.entries"  # another schema: qualified
    assert {r.headers[Headers.CORRELATION_ID] for r in context.recorded} == {"saga-7"}


async def test_the_runtime_checks_still_apply() -> None:
    context = TestableHandlerContext(Charge("o3"), endpoint=endpoint, reply_to=None)

    with pytest.raises(ConfigurationError, match="it is a command"):
        await context.publish(Charge("o3"))
    with pytest.raises(EndpointRuntimeError, match=r"no NServiceBus\.ReplyToAddress"):
        await context.reply(Receipt("o3"))
    send_only = TestableHandlerContext(endpoint=Endpoint("web", send_only=True))
    with pytest.raises(ConfigurationError, match="cannot defer"):
        await send_only.send(Receipt("o3"), destination="mail", delay=timedelta(seconds=1))
    assert context.recorded == []
    assert send_only.recorded == []


async def test_a_handler_that_uses_the_connection_gets_a_clear_error_or_the_given_one() -> None:
    without = TestableHandlerContext(Charge("o4"), endpoint="payments")
    with pytest.raises(EndpointRuntimeError,
                       match=r"context\.connection\.fetchval.*has no database connection"):
        await without.connection.fetchval("SELECT 1")

    given = object()  # whatever the test hands over is what the handler gets
    assert TestableHandlerContext(connection=given).connection is given  # type: ignore[arg-type]


async def test_a_send_that_failed_is_not_recorded() -> None:
    """Self-test of the record: a dispatch that raises leaves no send behind."""
    context = TestableHandlerContext(Charge("o5"), endpoint=endpoint)

    async def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("refused")

    context.dispatcher.dispatch = refuse  # type: ignore[method-assign]
    with pytest.raises(OSError, match="refused"):
        await context.send(Receipt("o5"), destination="mail")
    assert context.sent == []


async def test_invoke_needs_a_handler_of_the_type() -> None:
    with pytest.raises(ConfigurationError, match="no handler for Receipt"):
        await invoke(endpoint, Receipt("o6"))
