from __future__ import annotations

import asyncio
import uuid
from datetime import datetime

import msgspec
import pytest

from endpoint_runtime.context import HandlerContext
from endpoint_runtime.messages import OutgoingMessage, TransportMessage
from endpoint_runtime.transport.addresses import QueueAddress


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
