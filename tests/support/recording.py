"""An outgoing dispatcher that records: for pure-logic tests of a handler context (no
transport involved)."""

from __future__ import annotations

from datetime import datetime

from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import OutgoingMessage


class RecordingDispatcher:
    """An outgoing dispatcher for pure-logic tests of a handler context: keeps what it is
    given, in order (no transport involved)."""

    can_defer = False

    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []

    async def dispatch(self, address: QueueAddress, message: OutgoingMessage, *,
                       immediate: bool, due: datetime | None = None) -> None:
        self.sent.append(message)
