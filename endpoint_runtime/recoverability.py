"""Recoverability: immediate retries, then the error queue.

A failed attempt rolls back, so the row is visible again; the failure count lives in memory per
receiver, keyed by the row id (an LRU of 10,000 entries, as in the original), and the next
delivery consults it first: when retries are used up the message goes to the error queue with
the error headers below, inside that delivery's transaction, without running handlers.
Unrecoverable failures (a body that does not decode, a type with no handler, or exception
types listed by the user) go to the error queue at their next delivery, without retries.
"""

from __future__ import annotations

import collections
import traceback
import uuid

import msgspec

from endpoint_runtime.errors import MessageDecodeError, UnknownMessageTypeError
from endpoint_runtime.messages import Headers, OutgoingMessage, TransportMessage, to_wire_time
from endpoint_runtime.messages import utc_now as _utc_now
from endpoint_runtime.outgoing import MACHINE

FAILURE_CACHE_SIZE = 10_000
MAX_EXCEPTION_MESSAGE = 16_384


class ErrorHeaders:
    FAILED_QUEUE = "NServiceBus.FailedQ"
    EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
    INNER_EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.InnerExceptionType"
    HELP_LINK = "NServiceBus.ExceptionInfo.HelpLink"
    MESSAGE = "NServiceBus.ExceptionInfo.Message"
    SOURCE = "NServiceBus.ExceptionInfo.Source"
    STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"
    TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"


class Failure(msgspec.Struct, kw_only=True):
    """What is known of a message's failed attempts."""

    attempts: int
    exception_type: str
    inner_exception_type: str
    message: str
    source: str
    stack_trace: str
    unrecoverable: bool


DEFAULT_UNRECOVERABLE: tuple[type[BaseException], ...] = (
    MessageDecodeError,
    UnknownMessageTypeError,
)


def _type_name(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


class FailedMessages:
    """Failure counts per row id, least recently used dropped beyond ``capacity``."""

    def __init__(self, capacity: int = FAILURE_CACHE_SIZE) -> None:
        self._capacity = capacity
        self._failures: collections.OrderedDict[uuid.UUID, Failure] = collections.OrderedDict()

    def get(self, native_id: uuid.UUID) -> Failure | None:
        failure = self._failures.get(native_id)
        if failure is not None:
            self._failures.move_to_end(native_id)
        return failure

    def record(self, native_id: uuid.UUID, exc: BaseException, unrecoverable: bool) -> Failure:
        previous = self._failures.pop(native_id, None)
        tb = exc.__traceback__
        frames = traceback.extract_tb(tb) if tb else []
        failure = Failure(
            attempts=(previous.attempts if previous else 0) + 1,
            exception_type=_type_name(exc),
            inner_exception_type=_type_name(exc.__cause__ or exc.__context__),
            message=str(exc)[:MAX_EXCEPTION_MESSAGE],
            source=frames[-1].name if frames else "",
            stack_trace="".join(traceback.format_exception(exc)),
            unrecoverable=unrecoverable,
        )
        self._failures[native_id] = failure
        if len(self._failures) > self._capacity:
            self._failures.popitem(last=False)
        return failure

    def forget(self, native_id: uuid.UUID) -> None:
        self._failures.pop(native_id, None)

    def __len__(self) -> int:
        return len(self._failures)


class RecoverabilityPolicy:
    """Decides, from a message's failures, whether it goes to the error queue now."""

    def __init__(
        self,
        immediate_retries: int,
        unrecoverable: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.immediate_retries = immediate_retries
        self.unrecoverable = DEFAULT_UNRECOVERABLE + tuple(unrecoverable)

    def is_unrecoverable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.unrecoverable)

    def retries_exhausted(self, failure: Failure) -> bool:
        return failure.unrecoverable or failure.attempts > self.immediate_retries


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
        ErrorHeaders.TIME_OF_FAILURE: to_wire_time(_utc_now()),
        Headers.PROCESSING_MACHINE: MACHINE,
        Headers.PROCESSING_ENDPOINT: endpoint,
    })
    headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
    return OutgoingMessage(
        message_id=str(message.native_id), headers=headers, body=message.body,
        time_to_be_received=None,
    )
