"""Receive (DELETE of the lowest unlocked seq), batched receive, re-insert, and peek.

Receive functions run on a connection whose transaction the caller owns: the transaction
mode decides whether the DELETE commits before, with, or without the handler's work.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import asyncpg

from endpoint_runtime.errors import PoisonMessageError, QueueNotFoundError
from endpoint_runtime.transport import statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection
from endpoint_runtime.wire.messages import PoisonMessage, TransportMessage, decode_headers

Received = TransportMessage | PoisonMessage
FULL_SCAN_INTERVAL = 1.0  # seconds: how often a connection's receive scans from the start


class ReceivePosition:
    """Where one connection's receives of one queue start: past the seq it took last, minus
    one, so that a message it took and rolled back is found again first. Other connections'
    rolled-back messages and late commits below it are found by the scan from the start,
    which the statement falls back to when nothing lies past the position, and which runs at
    least every ``FULL_SCAN_INTERVAL`` seconds."""

    __slots__ = ("floor", "full_scan_due")

    def __init__(self) -> None:
        self.floor = 0
        self.full_scan_due = 0.0

    def start(self) -> int:
        now = time.monotonic()
        if now >= self.full_scan_due:
            self.full_scan_due = now + FULL_SCAN_INTERVAL
            return 0
        return self.floor

    def taken(self, seq: int | None) -> None:
        self.floor = 0 if seq is None else seq - 1


def receive_position(
    connection: DatabaseConnection, address: QueueAddress
) -> ReceivePosition | None:
    """The connection's position in ``address``; ``None`` on a connection that keeps none (it
    is no ``transport.connection.QueueConnection``): its receives scan from the start."""
    positions: dict[QueueAddress, ReceivePosition] | None = getattr(
        connection, "receive_positions", None)
    if positions is None:
        return None
    position = positions.get(address)
    if position is None:
        position = positions[address] = ReceivePosition()
    return position


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


async def receive(connection: DatabaseConnection, address: QueueAddress) -> Received | None:
    """Take the lowest-seq unlocked message; ``None`` when none is left.

    Expired rows are deleted (in the caller's transaction) and skipped, never returned.
    The scan starts past the connection's last taken seq (see ``receive_past`` in
    ``queue.sql``), so a message that becomes visible below it, e.g. one whose sender
    committed late, waits at most ``FULL_SCAN_INTERVAL`` under load.
    """
    row = await receive_row(connection, address, receive_statement(address))
    return None if row is None else to_message(row)


def receive_statement(address: QueueAddress) -> str:
    """The statement :func:`receive` runs (``receive_past`` in ``queue.sql``)."""
    return statements.for_queue(address)["receive_past"]


async def receive_row(connection: DatabaseConnection, address: QueueAddress, statement: str) -> Any:
    """:func:`receive` with another statement that takes the receive's one parameter (the
    seq to start past) and returns its columns (and maybe more): the row, for the caller to
    turn into a message with :func:`to_message`."""
    position = receive_position(connection, address)
    while True:
        try:
            row = await connection.fetchrow(statement, position.start() if position else 0)
        except asyncpg.UndefinedTableError as exc:
            raise QueueNotFoundError(str(address)) from exc
        if position is not None:
            position.taken(None if row is None else row["seq"])
        if row is None or not row["expired"]:
            return row


async def receive_batch(
    connection: DatabaseConnection, address: QueueAddress, limit: int
) -> list[Received]:
    """Take up to ``limit`` unlocked messages in seq order (expired ones deleted, skipped),
    starting past the connection's position as :func:`receive` does. The position becomes
    the lowest seq taken minus one: a batch that rolls back is found again whole.

    An empty list means the queue had nothing to take: a batch of expired rows only is
    deleted and the next batch taken, as :func:`receive` does, so that a caller does not
    mistake it for an empty queue and leave the rows behind it waiting."""
    position = receive_position(connection, address)
    statement = statements.for_queue(address)["receive_batch"]
    while True:
        try:
            rows = await connection.fetch(statement, limit, position.start() if position else 0)
        except asyncpg.UndefinedTableError as exc:
            raise QueueNotFoundError(str(address)) from exc
        if position is not None:
            position.taken(rows[0]["seq"] if rows else None)
        live = [to_message(row) for row in rows if not row["expired"]]
        if live or not rows:
            return live


async def reinsert(
    connection: DatabaseConnection | asyncpg.Pool,
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
    executor: DatabaseConnection | asyncpg.Pool, address: QueueAddress, cap: int | None = None
) -> int:
    """Estimate of waiting messages: max(seq) - min(seq) + 1 over unlocked rows."""
    try:
        estimate: int = await executor.fetchval(statements.for_queue(address)["peek"])
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return min(estimate, cap) if cap is not None else estimate
