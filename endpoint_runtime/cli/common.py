"""What every command module shares: exit statuses, argument types, queue look-up."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from typing import Any

# The argument types, importable from here as they always were (the report and the submit
# script use them too, and the report is a library first: they live below the commands).
from endpoint_runtime.arguments import positive_float as positive_float
from endpoint_runtime.arguments import positive_int as positive_int
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.transport import queues as queue_tables

PROG = "endpoint-runtime"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

Command = Callable[[argparse.Namespace, TransportSettings], Coroutine[Any, Any, int]]
"""A command: the parsed arguments and the loaded settings in, the exit status out."""

async def existing_queue(transport: PostgresTransport, name: str) -> QueueAddress:
    """The address of ``name``; :class:`QueueNotFoundError` when its table does not exist."""
    address = transport.address(name)
    if not await queue_tables.queue_exists(transport.pool, address):
        raise QueueNotFoundError(str(address))
    return address


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with control characters escaped (``\\x1b``), but for those in ``keep``.

    What the commands print may come from anywhere (failed messages, table names): it must
    not drive the terminal.
    """
    text = text.replace("\r\n", "\n")  # stack traces written on Windows
    return "".join(
        char if char in keep or not _is_control(char) else repr(char)[1:-1] for char in text
    )


def _is_control(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code < 0xA0
