from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

import msgspec
import pytest

from endpoint_runtime.chain.context import HandlerContext
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.wire.messages import Headers, OutgoingMessage, TransportMessage
from tests.support.recording import RecordingDispatcher


class Ping(msgspec.Struct):
    n: int


class FlakyDispatcher:
    """Fails the first dispatch, then records what it is given."""

    can_defer = False

    def __init__(self) -> None:
        self.calls = 0
        self.sent: list[tuple[QueueAddress, str]] = []

    async def dispatch(self, address: QueueAddress, message: OutgoingMessage, *,
                       immediate: bool, due: datetime | None = None) -> None:
        self.calls += 1
        if self.calls == 1:
            raise OSError("connection lost")
        self.sent.append((address, message.message_id))


def context(dispatcher: FlakyDispatcher) -> HandlerContext:
    message = TransportMessage(native_id=uuid.uuid4(), seq=1, headers={}, raw_headers="{}",
                               body=b"{}")
    return HandlerContext(message=message, endpoint="sales", local_address=QueueAddress("sales"),
                          dispatcher=dispatcher, connection=None)


def test_a_failed_send_can_be_repeated_and_a_sent_one_is_not_repeated() -> None:
    dispatcher = FlakyDispatcher()
    subject = context(dispatcher)

    async def scenario() -> None:
        with pytest.raises(OSError, match="connection lost"):
            await subject.send(Ping(1), "billing", message_id="m-1")
        await subject.send(Ping(1), "billing", message_id="m-1")  # the handler tries again
        await subject.send(Ping(1), "billing", message_id="m-1")  # a duplicate: dropped
        await subject.send(Ping(1), "audit", message_id="m-1")  # another queue: sent

    asyncio.run(scenario())
    assert dispatcher.sent == [(QueueAddress("billing"), "m-1"), (QueueAddress("audit"), "m-1")]


def incoming(headers: dict[str, str]) -> TransportMessage:
    return TransportMessage(native_id=uuid.uuid4(), seq=1, headers=headers, raw_headers="{}",
                            body=b"{}")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({Headers.MESSAGE_ID: "in-1", Headers.CORRELATION_ID: "corr-1"}, "corr-1"),
        ({Headers.MESSAGE_ID: "in-1", Headers.CORRELATION_ID: ""}, "in-1"),
        ({Headers.MESSAGE_ID: "in-1"}, "in-1"),
    ],
    ids=["incoming-correlation-id", "empty-correlation-id", "no-correlation-id"],
)
def test_every_outgoing_message_of_a_handler_carries_the_incoming_correlation_id(
    headers: dict[str, str], expected: str,
) -> None:
    """NServiceBus's rule: the incoming CorrelationId, else the incoming message id; never
    the outgoing message's own id."""
    recorder = RecordingDispatcher()
    subject = HandlerContext(
        message=incoming({**headers, Headers.REPLY_TO_ADDRESS: "client"}), endpoint="sales",
        local_address=QueueAddress("sales"), dispatcher=recorder, connection=None)

    async def scenario() -> None:
        await subject.send(Ping(1), "billing")
        await subject.send_local(Ping(2))
        await subject.reply(Ping(3))
        await subject.send(Ping(4), "billing", headers={Headers.CORRELATION_ID: "chosen"})

    asyncio.run(scenario())
    assert [m.headers[Headers.CORRELATION_ID] for m in recorder.sent] == [
        expected, expected, expected, "chosen"]
    assert all(m.headers[Headers.CORRELATION_ID] != m.message_id for m in recorder.sent)
    assert subject.correlation_id == expected
