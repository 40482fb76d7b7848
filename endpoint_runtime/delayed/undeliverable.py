"""A delayed message that cannot be dispatched goes to the error queue, as it was stored.

The copy keeps the stored headers (or, when they do not parse, carries them whole in
``Headers.RAW_HEADERS``) and gets NServiceBus's failure headers, its destination as the
``NServiceBus.FailedQ``: retrying it from the error queue sends it there.
"""

from __future__ import annotations

from endpoint_runtime.delayed.store import DelayedMessage
from endpoint_runtime.transport import sending
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.sending import Executor
from endpoint_runtime.wire.messages import (
    MACHINE,
    MAX_EXCEPTION_MESSAGE,
    ErrorHeaders,
    Headers,
    decode_headers,
    to_wire_time,
    utc_now,
)


async def move_undeliverable(
    executor: Executor, error_queue: QueueAddress, message: DelayedMessage, exc: Exception,
    endpoint: str,
) -> None:
    """Write the error-queue copy of ``message``, which failed to dispatch with ``exc``."""
    try:
        headers = decode_headers(message.headers)
    except Exception:
        headers = {Headers.RAW_HEADERS: message.headers}
    headers.update({
        ErrorHeaders.FAILED_QUEUE: message.destination,
        ErrorHeaders.EXCEPTION_TYPE: f"{type(exc).__module__}.{type(exc).__qualname__}",
        ErrorHeaders.MESSAGE: str(exc)[:MAX_EXCEPTION_MESSAGE],
        ErrorHeaders.TIME_OF_FAILURE: to_wire_time(utc_now()),
        Headers.PROCESSING_MACHINE: MACHINE,
        Headers.PROCESSING_ENDPOINT: endpoint,
    })
    await sending.send_failed(executor, error_queue, message.id, headers, message.body)
