"""Receive (DELETE of the lowest unlocked seq), batched receive, re-insert, and peek.

Receive functions run on a connection whose transaction the caller owns: the transaction
mode decides whether the DELETE commits before, with, or without the handler's work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import asyncpg

from endpoint_runtime.errors import PoisonMessageError, QueueNotFoundError
from endpoint_runtime.messages import PoisonMessage, TransportMessage, decode_headers
from endpoint_runtime.transport import statements
from endpoint_runtime.transport.addresses import QueueAddress

Received = TransportMessage | PoisonMessage


def to_message(row: Any) -> Received:
    """A received row as a message, or as a poison message when its headers do not parse."""
    try:
        headers = decode_headers(row["headers"])
    except PoisonMessageError as exc:
        return PoisonMessage(
            native_id=row["id"],
            seq=row["seq"],
            raw_headers=row["headers"],
            body=bytes(row["body"] or b""),
            expires=row["expires"],
            reason=str(exc),
        )
    return TransportMessage(
        native_id=row["id"],
        seq=row["seq"],
        headers=headers,
        raw_headers=row["headers"],
        body=bytes(row["body"] or b""),
        expires=row["expires"],
    )


async def receive(connection: asyncpg.Connection, address: QueueAddress) -> Received | None:
    """Take the lowest-seq unlocked message; ``None`` when none is left.

    Expired rows are deleted (in the caller's transaction) and skipped, never returned.
    """
    row = await receive_row(connection, address, statements.for_queue(address)["receive"])
    return None if row is None else to_message(row)


async def receive_row(connection: asyncpg.Connection, address: QueueAddress, statement: str) -> Any:
    """:func:`receive` with another statement that returns the receive's columns (and maybe
    more): the row, for the caller to turn into a message with :func:`to_message`."""
    while True:
        try:
            row = await connection.fetchrow(statement)
        except asyncpg.UndefinedTableError as exc:
            raise QueueNotFoundError(str(address)) from exc
        if row is None or not row["expired"]:
            return row


async def receive_batch(
    connection: asyncpg.Connection, address: QueueAddress, limit: int
) -> list[Received]:
    """Take up to ``limit`` unlocked messages in seq order (expired ones deleted, skipped)."""
    try:
        rows = await connection.fetch(statements.for_queue(address)["receive_batch"], limit)
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return [to_message(row) for row in rows if not row["expired"]]


async def reinsert(
    connection: asyncpg.Connection | asyncpg.Pool,
    address: QueueAddress,
    messages: Iterable[Received],
) -> None:
    """Put received rows back byte for byte with their original seq, so FIFO order is kept."""
    statement = statements.for_queue(address)["reinsert"]
    await connection.executemany(
        statement,
        [(m.native_id, m.expires, m.raw_headers, m.body, m.seq) for m in messages],
    )


async def peek(
    executor: asyncpg.Connection | asyncpg.Pool, address: QueueAddress, cap: int | None = None
) -> int:
    """Estimate of waiting messages: max(seq) - min(seq) + 1 over unlocked rows."""
    try:
        estimate: int = await executor.fetchval(statements.for_queue(address)["peek"])
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return min(estimate, cap) if cap is not None else estimate
