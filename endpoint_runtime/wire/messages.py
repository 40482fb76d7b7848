"""Envelope of a message: header names, ids, timestamps, and the rows the transport moves.

Header names and the timestamp wire format are those of NServiceBus, so that a row written by
NServiceBus's PostgreSQL transport can be received here and the other way round.
"""

from __future__ import annotations

import enum
import os
import platform
import re
import uuid
from datetime import UTC, datetime

import msgspec

from endpoint_runtime.errors import PoisonMessageError

MACHINE = platform.node()
"""This machine's name, as the ``*Machine`` headers carry it."""
MAX_EXCEPTION_MESSAGE = 16_384
"""Most characters of an exception message kept in a failure header."""


class Headers:
    """Standard header names (NServiceBus wire names)."""

    MESSAGE_ID = "NServiceBus.MessageId"
    CORRELATION_ID = "NServiceBus.CorrelationId"
    CONVERSATION_ID = "NServiceBus.ConversationId"
    RELATED_TO = "NServiceBus.RelatedTo"
    ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
    CONTENT_TYPE = "NServiceBus.ContentType"
    MESSAGE_INTENT = "NServiceBus.MessageIntent"
    REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
    TIME_SENT = "NServiceBus.TimeSent"
    DELIVER_AT = "NServiceBus.DeliverAt"
    TIME_TO_BE_RECEIVED = "NServiceBus.TimeToBeReceived"
    ORIGINATING_ENDPOINT = "NServiceBus.OriginatingEndpoint"
    ORIGINATING_MACHINE = "NServiceBus.OriginatingMachine"
    VERSION = "NServiceBus.Version"
    PROCESSING_STARTED = "NServiceBus.ProcessingStarted"
    PROCESSING_ENDED = "NServiceBus.ProcessingEnded"
    PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
    PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
    TRACEPARENT = "traceparent"
    ORIGINAL_NATIVE_ID = "EndpointRuntime.OriginalNativeId"
    """On an error-queue row that took a fresh id: the native id it had (restored on retry)."""
    SAGA_ID = "NServiceBus.SagaId"
    """On a reply or a timeout: the saga instance it goes to (found by id, not correlation)."""
    SAGA_TYPE = "NServiceBus.SagaType"
    ORIGINATING_SAGA_ID = "NServiceBus.OriginatingSagaId"
    """On a message a saga sent: the sending instance (a reply copies it to ``SAGA_ID``)."""
    ORIGINATING_SAGA_TYPE = "NServiceBus.OriginatingSagaType"
    IS_SAGA_TIMEOUT = "NServiceBus.IsSagaTimeoutMessage"
    INVOKED_SAGAS = "NServiceBus.InvokedSagas"
    """On an audit copy: ``type:id`` of each saga instance the message reached, ``;``-joined."""
    SAGA_CHANGES = "EndpointRuntime.SagaChanges"
    """Ours: on an audit copy, ``type:id:change`` (New, Updated, Completed) per instance."""
    RAW_HEADERS = "NServiceBus.RawHeaders"
    """Ours, not NServiceBus's: on an error-queue copy of a delayed message whose headers did
    not parse, those headers as they were."""


class ErrorHeaders:
    """Headers of a message in the error queue (NServiceBus names)."""

    FAILED_QUEUE = "NServiceBus.FailedQ"
    EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
    INNER_EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.InnerExceptionType"
    HELP_LINK = "NServiceBus.ExceptionInfo.HelpLink"
    MESSAGE = "NServiceBus.ExceptionInfo.Message"
    SOURCE = "NServiceBus.ExceptionInfo.Source"
    STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"
    TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
    ALL = (FAILED_QUEUE, EXCEPTION_TYPE, INNER_EXCEPTION_TYPE, HELP_LINK, MESSAGE, SOURCE,
           STACK_TRACE, TIME_OF_FAILURE)


class RetryHeaders:
    """Headers of a delayed retry (NServiceBus names)."""

    RETRIES = "NServiceBus.Retries"
    TIMESTAMP = "NServiceBus.Retries.Timestamp"


class MessageIntent(enum.StrEnum):
    """Why a message was sent (header ``NServiceBus.MessageIntent``)."""

    SEND = "Send"
    PUBLISH = "Publish"
    REPLY = "Reply"


JSON_CONTENT_TYPE = "application/json"

_WIRE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S:%f"


def to_wire_time(moment: datetime) -> str:
    """Format a moment as NServiceBus does: ``yyyy-MM-dd HH:mm:ss:ffffff Z`` in UTC."""
    if moment.tzinfo is None:
        raise ValueError("wire timestamps need an aware datetime")
    # isoformat is several times faster than strftime, and this runs for every message.
    text = moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
    return f"{text[:19]}:{text[20:]} Z"


def wire_time_now() -> str:
    """The current time in the wire format (the fast path of ``to_wire_time(utc_now())``)."""
    text = datetime.now(UTC).isoformat(" ", "microseconds")  # ...:SS.ffffff+00:00
    return f"{text[:19]}:{text[20:26]} Z"


def from_wire_time(text: str) -> datetime:
    """Parse a wire timestamp written by :func:`to_wire_time` (or by NServiceBus)."""
    stamp = text.strip()
    if stamp.endswith("Z"):
        stamp = stamp[:-1].rstrip()
    return datetime.strptime(stamp, _WIRE_TIME_FORMAT).replace(tzinfo=UTC)


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_message_id() -> str:
    """A new message id: a random (version 4) UUID in its canonical text form.

    Built from the random bytes directly: ``str(uuid.uuid4())`` costs twice as much, and this
    runs for every outgoing message.
    """
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_canonical_uuid(text: str) -> bool:
    """Whether ``text`` is a UUID in lower-case canonical form (usable as a row id as is)."""
    return _CANONICAL_UUID.fullmatch(text) is not None


class OutgoingMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A message ready for the wire: what one INSERT into a queue table carries.

    ``time_to_be_received`` in seconds sets the row's ``expires`` column; ``None`` never expires.
    """

    message_id: str
    headers: dict[str, str]
    body: bytes
    time_to_be_received: float | None = None


# ``gc=False`` on the message structs: their fields (text, bytes, ids, times, a dict of
# strings) cannot lead back to them, so they can never be part of a reference cycle, and the
# cyclic collector need not track the one or two of them every message makes.
class TransportMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A message taken off a queue table, headers parsed, body still raw."""

    native_id: uuid.UUID
    seq: int
    headers: dict[str, str]
    raw_headers: str
    body: bytes
    expires: datetime | None = None

    @property
    def message_id(self) -> str:
        """The logical id (header), falling back to the row id for foreign senders."""
        return self.headers.get(Headers.MESSAGE_ID) or str(self.native_id)


class PoisonMessage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A row whose headers do not parse: kept raw, never handed to a handler."""

    native_id: uuid.UUID
    seq: int
    raw_headers: str
    body: bytes
    expires: datetime | None
    reason: str


_headers_decoder = msgspec.json.Decoder(dict[str, str])
_headers_encoder = msgspec.json.Encoder()


def encode_headers(headers: dict[str, str]) -> str:
    return _headers_encoder.encode(headers).decode()


def decode_headers(raw: str) -> dict[str, str]:
    """Parse the headers column; raises :class:`PoisonMessageError` when it is not a JSON
    object of strings (NServiceBus: "probable message metadata corruption")."""
    try:
        return _headers_decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:
        raise PoisonMessageError(f"probable message metadata corruption: {exc}") from exc
