"""Audit copies and failed messages as typed rows (pure: no database).

An audit copy carries the original headers plus the processing headers; a failed message the
original headers plus ``NServiceBus.ExceptionInfo.*``. Each becomes one row of ``audit_log`` or
``error_log``. Times are the wire format's (``yyyy-MM-dd HH:mm:ss:ffffff Z``). Processing time
is ProcessingEnded - ProcessingStarted; critical time is ProcessingEnded - TimeSent, as the
original's metrics define it.

Nothing that comes off a queue is trusted: a row whose headers do not parse, or whose
processing times do not, is recorded in ``error_log`` with the reason, never dropped and never
allowed to stop ingestion.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

from endpoint_runtime.chain.recoverability.policy import (
    MAX_EXCEPTION_MESSAGE,
    ErrorHeaders,
    RetryHeaders,
)
from endpoint_runtime.wire.failure_groups import FailureGroup, failure_group
from endpoint_runtime.wire.messages import (
    Headers,
    PoisonMessage,
    TransportMessage,
    decode_headers,
    from_wire_time,
)
from endpoint_runtime.wire.serialization import enclosed_type_names

MAX_FIELD = 1_000
"""Characters kept of a header value that names something (hostile input can be long)."""


class AuditRecord(msgspec.Struct, frozen=True, kw_only=True):
    message_id: str
    message_type: str | None
    intent: str | None
    sending_endpoint: str | None
    sending_machine: str | None
    processing_endpoint: str | None
    processing_machine: str | None
    conversation_id: str | None
    related_to: str | None
    time_sent: datetime | None
    processing_started: datetime
    processing_ended: datetime
    processing_time_ms: float
    critical_time_ms: float | None
    body_size: int
    retries: int
    headers: str


class ErrorRecord(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    """The queue the row came from (the error queue, or the audit queue for bad copies)."""
    native_id: uuid.UUID | None
    queue_seq: int | None
    message_id: str | None
    message_type: str | None
    intent: str | None
    sending_endpoint: str | None
    processing_endpoint: str | None
    processing_machine: str | None
    failed_queue: str | None
    conversation_id: str | None
    related_to: str | None
    time_sent: datetime | None
    time_of_failure: datetime | None
    retries: int
    exception_type: str | None
    exception_message: str | None
    body_size: int
    headers: str
    reason: str | None
    """Why the row is here when it is not a failure the runtime recorded (malformed input)."""
    failure_group: str
    """Its failure group's key (:mod:`endpoint_runtime.wire.failure_groups`)."""
    failure_title: str
    """Its failure group's title: the exception message's first line, ids masked."""


class MalformedError(ValueError):
    """A header a record needs does not parse."""


def _field(headers: dict[str, str], name: str) -> str | None:
    value = headers.get(name)
    return value[:MAX_FIELD] if value else None


def _time(headers: dict[str, str], name: str) -> datetime | None:
    value = headers.get(name)
    if not value:
        return None
    try:
        return from_wire_time(value)
    except ValueError as exc:
        raise MalformedError(f"{name} is not a wire time: {value[:100]!r}") from exc


def _required_time(headers: dict[str, str], name: str) -> datetime:
    moment = _time(headers, name)
    if moment is None:
        raise MalformedError(f"no {name} header")
    return moment


def _retries(headers: dict[str, str]) -> int:
    try:
        return max(0, min(int(headers.get(RetryHeaders.RETRIES, "0")), 2**31 - 1))
    except ValueError:
        return 0


def _message_type(headers: dict[str, str]) -> str | None:
    names = enclosed_type_names(headers.get(Headers.ENCLOSED_MESSAGE_TYPES, ""))
    return names[0][:MAX_FIELD] if names else None


def _milliseconds(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() * 1000.0


def audit_record(message: TransportMessage) -> AuditRecord:
    """The ``audit_log`` row of an audit copy; :class:`MalformedError` when it lacks its
    processing times or they do not parse."""
    headers = message.headers
    started = _required_time(headers, Headers.PROCESSING_STARTED)
    ended = _required_time(headers, Headers.PROCESSING_ENDED)
    sent = _time(headers, Headers.TIME_SENT)
    return AuditRecord(
        message_id=message.message_id[:MAX_FIELD],
        sending_machine=_field(headers, Headers.ORIGINATING_MACHINE),
        time_sent=sent,
        processing_started=started,
        processing_ended=ended,
        processing_time_ms=_milliseconds(started, ended),
        critical_time_ms=_milliseconds(sent, ended) if sent is not None else None,
        body_size=len(message.body),
        headers=message.raw_headers,
        **_shared_fields(headers),
    )


def _shared_fields(headers: dict[str, str]) -> dict[str, Any]:
    """The columns ``audit_log`` and ``error_log`` both take from a message's headers."""
    return {
        "message_type": _message_type(headers),
        "intent": _field(headers, Headers.MESSAGE_INTENT),
        "sending_endpoint": _field(headers, Headers.ORIGINATING_ENDPOINT),
        "processing_endpoint": _field(headers, Headers.PROCESSING_ENDPOINT),
        "processing_machine": _field(headers, Headers.PROCESSING_MACHINE),
        "conversation_id": _field(headers, Headers.CONVERSATION_ID),
        "related_to": _field(headers, Headers.RELATED_TO),
        "retries": _retries(headers),
    }


def group_of(exception_type: str | None, message: str | None,
             headers: dict[str, str]) -> FailureGroup:
    """The failure group of an error row: its exception type, its message (else why the row
    is here) and its stack trace header."""
    return failure_group(exception_type, message, headers.get(ErrorHeaders.STACK_TRACE))


def group_of_row(exception_type: str | None, message: str | None, reason: str | None,
                 raw_headers: str) -> FailureGroup:
    """The failure group of a stored ``error_log`` row (rows written before the column)."""
    try:
        headers = decode_headers(raw_headers)
    except Exception:
        headers = {}
    return group_of(exception_type, message or reason, headers)


def error_record(
    source: str, native_id: uuid.UUID, seq: int, raw_headers: str, body_size: int,
    reason: str | None = None,
) -> ErrorRecord:
    """The ``error_log`` row of a failed message, or of any row that cannot be recorded
    otherwise (``reason`` says why); headers that do not parse are kept raw, with a reason."""
    try:
        headers = decode_headers(raw_headers)
    except Exception as exc:
        headers = {}
        reason = reason or f"headers do not parse: {exc}"[:MAX_FIELD]
    times: dict[str, datetime | None] = {}
    for name in (Headers.TIME_SENT, ErrorHeaders.TIME_OF_FAILURE):
        try:
            times[name] = _time(headers, name)
        except MalformedError as exc:
            times[name] = None
            reason = reason or str(exc)
    message = headers.get(ErrorHeaders.MESSAGE)
    exception_type = _field(headers, ErrorHeaders.EXCEPTION_TYPE)
    group = group_of(exception_type, message or reason, headers)
    return ErrorRecord(
        source=source, native_id=native_id, queue_seq=seq,
        message_id=_field(headers, Headers.MESSAGE_ID),
        failed_queue=_field(headers, ErrorHeaders.FAILED_QUEUE),
        time_sent=times[Headers.TIME_SENT],
        time_of_failure=times[ErrorHeaders.TIME_OF_FAILURE],
        exception_type=exception_type,
        exception_message=message[:MAX_EXCEPTION_MESSAGE] if message else None,
        body_size=body_size,
        headers=raw_headers,
        reason=reason,
        failure_group=group.key,
        failure_title=group.title,
        **_shared_fields(headers),
    )


def records_of(
    source: str, batch: list[TransportMessage | PoisonMessage]
) -> tuple[list[AuditRecord], list[ErrorRecord]]:
    """Audit rows of the well-formed copies of ``batch``; error rows of the others."""
    audited: list[AuditRecord] = []
    malformed: list[ErrorRecord] = []
    for message in batch:
        if isinstance(message, PoisonMessage):
            malformed.append(error_record(source, message.native_id, message.seq,
                                          message.raw_headers, len(message.body),
                                          f"malformed audit copy: {message.reason}"))
            continue
        try:
            audited.append(audit_record(message))
        except MalformedError as exc:
            malformed.append(error_record(source, message.native_id, message.seq,
                                          message.raw_headers, len(message.body),
                                          f"malformed audit copy: {exc}"))
    return audited, malformed


def columns(records: list[Any], fields: tuple[str, ...]) -> list[list[Any]]:
    """Records as one list per column, in ``fields`` order (for ``unnest`` inserts)."""
    return [[getattr(record, name) for record in records] for name in fields]
