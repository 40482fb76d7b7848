"""Send: one INSERT per message, one round trip for many, or an EXECUTE to go with a COMMIT."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TypeAlias

import asyncpg

from endpoint_runtime.errors import QueueNotFoundError
from endpoint_runtime.transport import statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection, prepared_name
from endpoint_runtime.transport.literals import (
    bytea_literal,
    float_literal,
    inline_parameters,
    text_literal,
)
from endpoint_runtime.wire.messages import (
    Headers,
    OutgoingMessage,
    encode_headers,
    is_canonical_uuid,
)

# Above this many bytes of headers and body a message goes as parameters: a literal doubles
# the body (hex) and the server would parse it as SQL text.
STATEMENT_SIZE_LIMIT = 32 * 1024

Executor: TypeAlias = "DatabaseConnection | asyncpg.Pool"


def row_id(message_id: str) -> uuid.UUID | str:
    """The row id of a message: its message id when that is a canonical UUID (asyncpg takes
    the text as it is), else a fresh one: user-chosen message ids need not be UUIDs."""
    if is_canonical_uuid(message_id):
        return message_id
    try:
        return uuid.UUID(message_id)
    except ValueError:
        return uuid.uuid4()


def _native_id(message: OutgoingMessage) -> uuid.UUID | str:
    return row_id(message.message_id)


async def send(executor: Executor, address: QueueAddress, message: OutgoingMessage) -> None:
    """Insert one message into a queue table (in the executor's transaction, if any)."""
    try:
        await executor.execute(
            statements.for_queue(address)["send"],
            _native_id(message),
            message.time_to_be_received,
            encode_headers(message.headers),
            message.body,
        )
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc


async def send_statement(
    connection: DatabaseConnection, address: QueueAddress, message: OutgoingMessage
) -> str | None:
    """The send as a statement that can travel with others (e.g. just before COMMIT) in one
    simple query: ``EXECUTE name(literal values)``, the INSERT prepared once per session (see
    ``transport.connection``), or, on a connection that keeps no prepared statements (behind
    a transaction-mode pooler), the INSERT itself with the values written in. ``None`` when
    the message is too large to pay."""
    headers = encode_headers(message.headers)
    if len(headers) + len(message.body) > STATEMENT_SIZE_LIMIT:
        return None
    statement = statements.for_queue(address)["send"]
    try:
        name = await prepared_name(connection, statement, "uuid, float8, text, bytea")
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    ttbr = message.time_to_be_received
    values = (text_literal(str(_native_id(message))),
              "NULL" if ttbr is None else float_literal(ttbr),
              text_literal(headers), bytea_literal(message.body))
    if name is None:
        return inline_parameters(statement, values).strip().rstrip(";")
    return f"EXECUTE {name}({', '.join(values)})"


async def send_many(
    executor: Executor, address: QueueAddress, messages: Sequence[OutgoingMessage]
) -> None:
    """Insert messages into one queue in a single round trip, keeping their order."""
    if not messages:
        return
    if len(messages) == 1:
        await send(executor, address, messages[0])
        return
    try:
        await executor.execute(
            statements.for_queue(address)["send_many"],
            [_native_id(m) for m in messages],
            [m.time_to_be_received for m in messages],
            [encode_headers(m.headers) for m in messages],
            [m.body for m in messages],
        )
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc


async def send_raw(
    executor: Executor, address: QueueAddress, native_id: uuid.UUID, headers: str, body: bytes
) -> None:
    """Insert a row whose headers text is kept byte for byte (it may not even parse)."""
    try:
        await executor.execute(statements.for_queue(address)["send_raw"], native_id, headers, body)
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc


async def send_failed(
    executor: Executor, address: QueueAddress, native_id: uuid.UUID,
    headers: dict[str, str] | str, body: bytes,
) -> None:
    """Insert a failed message into the error queue ``address``; never refused for its id.

    ``headers`` as a dict gets :attr:`Headers.ORIGINAL_NATIVE_ID` if the row must take a fresh
    id; raw text (headers that do not parse) is kept byte for byte either way.
    """
    if isinstance(headers, str):
        text = renamed = headers
    else:
        text = encode_headers(headers)
        renamed = encode_headers({**headers, Headers.ORIGINAL_NATIVE_ID: str(native_id)})
    try:
        await executor.execute(
            statements.for_queue(address)["send_failed"], native_id, text, body, renamed
        )
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
