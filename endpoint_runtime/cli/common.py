"""What every command module shares: exit statuses, argument types, queue look-up."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from typing import Any

from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import PostgresTransport, QueueAddress
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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {value})")
    return value
