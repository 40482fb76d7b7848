"""The error queue: how failed messages get there, and the tooling to list, show, retry
(replay) and delete them.

The moves (for the chain's recoverability step, in every mode) build the error copy
here: the original headers plus NServiceBus's failure headers; the error queue never refuses a
copy (``transport.sending.send_failed``).

A retry moves a message back to its ``NServiceBus.FailedQ`` in one transaction, unchanged but
for the error headers (and the delayed-retry headers, so the replay gets its full retries). If
the replay fails again, recoverability sends it back here: nothing is lost.

Example::

    async with PostgresTransport.connect() as transport:
        for failed in await list_failed(transport):
            print(failed.native_id, failed.failed_queue, failed.exception_type)
"""

from __future__ import annotations

import uuid

import asyncpg
import msgspec

from endpoint_runtime.chain.recoverability.policy import Failure
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.transport import QueueAddress, sending, statements
from endpoint_runtime.transport.receiving import to_message
from endpoint_runtime.transport.sending import Executor
from endpoint_runtime.wire.failure_groups import FailureGroup, failure_group
from endpoint_runtime.wire.messages import (
    MACHINE,
    ErrorHeaders,
    Headers,
    OutgoingMessage,
    PoisonMessage,
    RetryHeaders,
    TransportMessage,
    encode_headers,
    to_wire_time,
    utc_now,
)

_STRIPPED_ON_RETRY = (*ErrorHeaders.ALL, RetryHeaders.RETRIES, RetryHeaders.TIMESTAMP,
                      Headers.ORIGINAL_NATIVE_ID,
                      Headers.PROCESSING_MACHINE, Headers.PROCESSING_ENDPOINT)


# -- moving failed messages there -------------------------------------------------------------


def error_copy(
    message: TransportMessage, failure: Failure, failed_queue: str, endpoint: str
) -> OutgoingMessage:
    """The message as it goes to the error queue: original headers plus the error headers,
    same id and body, no time-to-be-received."""
    headers = dict(message.headers)
    headers.update({
        ErrorHeaders.FAILED_QUEUE: failed_queue,
        ErrorHeaders.EXCEPTION_TYPE: failure.exception_type,
        ErrorHeaders.INNER_EXCEPTION_TYPE: failure.inner_exception_type,
        ErrorHeaders.HELP_LINK: "",
        ErrorHeaders.MESSAGE: failure.message,
        ErrorHeaders.SOURCE: failure.source,
        ErrorHeaders.STACK_TRACE: failure.stack_trace,
        ErrorHeaders.TIME_OF_FAILURE: to_wire_time(utc_now()),
        Headers.PROCESSING_MACHINE: MACHINE,
        Headers.PROCESSING_ENDPOINT: endpoint,
    })
    headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
    return OutgoingMessage(
        message_id=str(message.native_id), headers=headers, body=message.body,
        time_to_be_received=None,
    )


async def move_failed(
    executor: Executor, error_queue: QueueAddress, message: TransportMessage, failure: Failure,
    failed_queue: str, endpoint: str,
) -> None:
    """A message whose retries are used up (or unrecoverable), with its failure headers."""
    copy = error_copy(message, failure, failed_queue, endpoint)
    await sending.send_failed(executor, error_queue, message.native_id, copy.headers, copy.body)


async def move_poison(executor: Executor, error_queue: QueueAddress,
                      message: PoisonMessage) -> None:
    """Headers that do not parse: the raw row, byte for byte."""
    await sending.send_failed(executor, error_queue, message.native_id, message.raw_headers,
                              message.body)


# -- tooling ----------------------------------------------------------------------------------


class FailedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A row of the error queue, as the tooling shows it."""

    native_id: uuid.UUID
    failed_queue: str | None
    exception_type: str | None
    exception_message: str | None
    time_of_failure: str | None
    message: TransportMessage | PoisonMessage

    @property
    def group(self) -> FailureGroup:
        """Its failure group (:mod:`endpoint_runtime.wire.failure_groups`), as the console
        and the report group it; a poison message groups by why its headers do not parse."""
        if isinstance(self.message, PoisonMessage):
            return failure_group(None, f"headers do not parse: {self.message.reason}", None)
        return failure_group(self.exception_type, self.exception_message,
                             self.message.headers.get(ErrorHeaders.STACK_TRACE))


def _failed(row: asyncpg.Record) -> FailedMessage:
    message = to_message(row)
    headers = message.headers if isinstance(message, TransportMessage) else {}
    return FailedMessage(
        native_id=message.native_id,
        failed_queue=headers.get(ErrorHeaders.FAILED_QUEUE),
        exception_type=headers.get(ErrorHeaders.EXCEPTION_TYPE),
        exception_message=headers.get(ErrorHeaders.MESSAGE),
        time_of_failure=headers.get(ErrorHeaders.TIME_OF_FAILURE),
        message=message,
    )


def _error_address(transport: PostgresTransport, error_queue: str) -> QueueAddress:
    return transport.address(error_queue)


async def list_failed(
    transport: PostgresTransport, error_queue: str = "error", limit: int = 100, offset: int = 0
) -> list[FailedMessage]:
    address = _error_address(transport, error_queue)
    try:
        rows = await transport.pool.fetch(statements.for_queue(address)["browse"], limit, offset)
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return [_failed(row) for row in rows]


async def show_failed(
    transport: PostgresTransport, native_id: uuid.UUID, error_queue: str = "error"
) -> FailedMessage | None:
    address = _error_address(transport, error_queue)
    try:
        row = await transport.pool.fetchrow(statements.for_queue(address)["peek_by_id"], native_id)
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return _failed(row) if row is not None else None


async def retry_failed(
    transport: PostgresTransport, native_id: uuid.UUID, error_queue: str = "error"
) -> str:
    """Move one failed message back to its FailedQ; returns that queue's name.

    Raises :class:`EndpointRuntimeError` when the message is not there, has no FailedQ or
    unparseable headers; :class:`QueueNotFoundError` when the FailedQ no longer exists (the
    message then stays in the error queue).
    """
    address = _error_address(transport, error_queue)
    async with transport.pool.acquire() as connection, connection.transaction():
        try:
            row = await connection.fetchrow(
                statements.for_queue(address)["take_by_id"], native_id
            )
        except asyncpg.UndefinedTableError as exc:
            raise QueueNotFoundError(str(address)) from exc
        if row is None:
            raise EndpointRuntimeError(f"no message {native_id} in {address}")
        failed = _failed(row)
        if not isinstance(failed.message, TransportMessage):
            raise EndpointRuntimeError(
                f"message {native_id} has headers that do not parse; it cannot be retried"
            )
        if not failed.failed_queue:
            raise EndpointRuntimeError(f"message {native_id} has no {ErrorHeaders.FAILED_QUEUE}")
        headers = {k: v for k, v in failed.message.headers.items()
                   if k not in _STRIPPED_ON_RETRY}
        original_id = _original_native_id(failed.message) or native_id
        destination = transport.address(failed.failed_queue)
        try:
            await sending.send_raw(connection, destination, original_id,
                                   encode_headers(headers), failed.message.body)
        except asyncpg.UniqueViolationError as exc:
            raise EndpointRuntimeError(
                f"message {native_id} cannot go back to {destination} yet: a message with its "
                f"native id {original_id} is there now; it stays in the error queue"
            ) from exc
    return failed.failed_queue


def _original_native_id(message: TransportMessage) -> uuid.UUID | None:
    """The native id a row had before the error queue gave it a fresh one (see
    ``transport.sending.send_failed``)."""
    try:
        return uuid.UUID(message.headers[Headers.ORIGINAL_NATIVE_ID])
    except (KeyError, ValueError):
        return None


class RetryAllResult(msgspec.Struct, frozen=True):
    """What ``retry --all`` did: messages moved per FailedQ, and how many stayed."""

    moved: dict[str, int]
    skipped: int


async def retry_all(transport: PostgresTransport, error_queue: str = "error") -> RetryAllResult:
    """Retry every retryable message; those that cannot be retried stay where they are."""
    moved: dict[str, int] = {}
    skipped = 0
    offset = 0
    while batch := await list_failed(transport, error_queue, limit=500, offset=offset):
        for failed in batch:
            try:
                queue = await retry_failed(transport, failed.native_id, error_queue)
            except EndpointRuntimeError:
                skipped += 1
                offset += 1  # stays in the error queue: page past it
                continue
            moved[queue] = moved.get(queue, 0) + 1
    return RetryAllResult(moved, skipped)


async def delete_failed(
    transport: PostgresTransport, native_id: uuid.UUID, error_queue: str = "error"
) -> bool:
    address = _error_address(transport, error_queue)
    try:
        row = await transport.pool.fetchrow(statements.for_queue(address)["take_by_id"], native_id)
    except asyncpg.UndefinedTableError as exc:
        raise QueueNotFoundError(str(address)) from exc
    return row is not None
