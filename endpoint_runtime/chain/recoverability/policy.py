"""Recoverability: immediate retries, delayed retries, then the error queue.

A failed attempt rolls back, so the row is visible again. The failure count lives in memory
per receiver, keyed by the row id (an LRU of 10,000 entries, as in the original), and the next
delivery consults it first (:meth:`RecoverabilityPolicy.decide`):

- attempts left -> handle again (immediate retry);
- immediate retries used up -> a delayed retry: the message is stored in the endpoint's
  delayed-message store for its own queue, due after ``delay x n`` for the n-th delayed retry,
  with headers ``NServiceBus.Retries`` and ``NServiceBus.Retries.Timestamp`` (a re-delivered
  message starts a new immediate-retry count);
- delayed retries used up, or the first one more than ``give_up_after`` ago -> error queue,
  with the error headers below.

Unrecoverable failures (a body that does not decode, a type with no handler, exception types
the user lists) go to the error queue at their next delivery. A handler can also raise
:class:`RetryLater` (a delayed retry now) or :class:`DiscardMessage` (drop it, with a reason).
"""

from __future__ import annotations

import collections
import enum
import traceback
import uuid
from collections.abc import Callable
from datetime import datetime

import msgspec
import structlog

from endpoint_runtime.errors import (
    DiscardMessage,
    MessageDecodeError,
    RetryLater,
    UnknownMessageTypeError,
)
from endpoint_runtime.wire.messages import (
    MAX_EXCEPTION_MESSAGE,
    ErrorHeaders,
    RetryHeaders,
    TransportMessage,
    from_wire_time,
    to_wire_time,
    utc_now,
)

# ErrorHeaders, RetryHeaders and MAX_EXCEPTION_MESSAGE are messages' now; importable from here
# as they always were.
__all__ = [
    "MAX_EXCEPTION_MESSAGE",
    "Action",
    "CustomPolicy",
    "Decision",
    "DiscardMessage",
    "ErrorHeaders",
    "FailedMessages",
    "Failure",
    "RecoverabilityPolicy",
    "RetryHeaders",
    "RetryLater",
    "RetryLimits",
    "delayed_retries_done",
    "delayed_retry_headers",
]

log = structlog.get_logger("endpoint_runtime.chain.recoverability")

FAILURE_CACHE_SIZE = 10_000
FAILURE_TEXT_BUDGET = 4_000_000
"""Characters of exception messages and stack traces the failure records keep in all; beyond
it the oldest records keep only a short head of the message and tail of the stack trace."""
CUT_MESSAGE = 160
CUT_STACK_TRACE = 640


class Action(enum.StrEnum):
    IMMEDIATE_RETRY = "immediate_retry"
    DELAYED_RETRY = "delayed_retry"
    ERROR_QUEUE = "error_queue"
    DISCARD = "discard"


class Decision(msgspec.Struct, frozen=True):
    action: Action
    delay: float = 0.0


class RetryLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Per-handler overrides of the endpoint's retry counts (``None``: the endpoint's)."""

    immediate_retries: int | None = None
    delayed_retries: int | None = None


SUMMARY_WIDTH = 200
"""Characters of a failure's one-line summary in the log."""


class Failure(msgspec.Struct, kw_only=True):
    """What is known of a message's failed attempts."""

    attempts: int
    exception_type: str
    inner_exception_type: str
    message: str
    source: str
    stack_trace: str
    unrecoverable: bool
    limits: RetryLimits = RetryLimits()
    requested_delay: float | None = None
    discard_reason: str | None = None

    def summary(self, width: int = SUMMARY_WIDTH) -> str:
        """``Type: message`` on one line, cut to ``width`` characters: what a log line of an
        attempt shows (the full message and stack trace go with the error queue's headers)."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        text = f"{self.exception_type}: {first}" if first else self.exception_type
        return text if len(text) <= width else text[: width - 3] + "..."


DEFAULT_UNRECOVERABLE: tuple[type[BaseException], ...] = (
    MessageDecodeError,
    UnknownMessageTypeError,
)


def _type_name(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


class FailedMessages:
    """Failure records per row id, least recently used dropped beyond ``capacity``.

    Bounded by size too: a record keeps up to 16 K characters of message and 64 K of stack
    trace (what the error queue's headers carry), and when all records together hold more
    than ``text_budget`` characters, the records whose text is oldest are cut to
    :data:`CUT_MESSAGE` and :data:`CUT_STACK_TRACE` characters (so all records hold at most
    about ``text_budget + capacity x 800`` characters: 12 M by default). Attempt counts are
    never cut: they are what stops a message from looping.
    """

    def __init__(
        self, capacity: int = FAILURE_CACHE_SIZE, text_budget: int = FAILURE_TEXT_BUDGET
    ) -> None:
        self._capacity = capacity
        self._text_budget = text_budget
        self._failures: collections.OrderedDict[uuid.UUID, Failure] = collections.OrderedDict()
        self._uncut: collections.OrderedDict[uuid.UUID, None] = collections.OrderedDict()
        self.text_size = 0
        """Characters of message and stack trace held by all records."""

    def get(self, native_id: uuid.UUID) -> Failure | None:
        failure = self._failures.get(native_id)
        if failure is not None:
            self._failures.move_to_end(native_id)
        return failure

    def record(
        self, native_id: uuid.UUID, exc: BaseException, *, unrecoverable: bool,
        limits: RetryLimits | None = None, with_trace: bool = True,
    ) -> Failure:
        """Count a failed attempt of ``native_id``. ``with_trace=False`` leaves the stack trace
        out (formatting one costs ~0.1-0.2 ms: an attempt that is retried at once never needs
        it); :meth:`keep_trace` adds it when the attempt turns out to be the last one."""
        previous = self._drop(native_id)
        failure = Failure(
            attempts=(previous.attempts if previous else 0) + 1,
            exception_type=_type_name(exc),
            inner_exception_type=_type_name(exc.__cause__ or exc.__context__),
            message=str(exc)[:MAX_EXCEPTION_MESSAGE],
            source=_innermost_function(exc),
            stack_trace=_stack_trace(exc) if with_trace else "",
            unrecoverable=unrecoverable,
            limits=limits or RetryLimits(),
            requested_delay=exc.delay.total_seconds() if isinstance(exc, RetryLater) else None,
            discard_reason=exc.reason if isinstance(exc, DiscardMessage) else None,
        )
        self._failures[native_id] = failure
        self._uncut[native_id] = None
        self.text_size += _text_size(failure)
        if len(self._failures) > self._capacity:
            self._drop(next(iter(self._failures)))
        while self.text_size > self._text_budget and self._uncut:
            self._cut(next(iter(self._uncut)))
        return self._failures.get(native_id, failure)

    def keep_trace(self, native_id: uuid.UUID, exc: BaseException) -> None:
        """Add ``exc``'s stack trace to the record of ``native_id`` (made without one)."""
        failure = self._failures.get(native_id)
        if failure is None or failure.stack_trace:
            return
        trace = _stack_trace(exc)
        if native_id not in self._uncut:  # cut already: it stays cut
            trace = trace[-CUT_STACK_TRACE:]
        failure.stack_trace = trace
        self.text_size += len(trace)
        while self.text_size > self._text_budget and self._uncut:
            self._cut(next(iter(self._uncut)))

    def restore(self, native_id: uuid.UUID, failure: Failure | None) -> None:
        """Put back a record that a move, since rolled back, forgot (unless a newer one is
        there)."""
        if failure is None or native_id in self._failures:
            return
        self._failures[native_id] = failure
        self._uncut[native_id] = None
        self.text_size += _text_size(failure)
        if len(self._failures) > self._capacity:
            self._drop(next(iter(self._failures)))

    def forget(self, native_id: uuid.UUID) -> None:
        if self._failures:
            self._drop(native_id)

    def _drop(self, native_id: uuid.UUID) -> Failure | None:
        failure = self._failures.pop(native_id, None)
        if failure is not None:
            self.text_size -= _text_size(failure)
            self._uncut.pop(native_id, None)
        return failure

    def _cut(self, native_id: uuid.UUID) -> None:
        """Keep the head of the message and the tail of the stack trace (its last frames and
        the exception line); the record keeps its place in the LRU order."""
        del self._uncut[native_id]
        failure = self._failures[native_id]
        trace = failure.stack_trace
        cut = msgspec.structs.replace(
            failure, message=failure.message[:CUT_MESSAGE],
            stack_trace=trace if len(trace) <= CUT_STACK_TRACE else trace[-CUT_STACK_TRACE:],
        )
        self._failures[native_id] = cut
        self.text_size += _text_size(cut) - _text_size(failure)

    def __len__(self) -> int:
        return len(self._failures)


def _stack_trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[:MAX_EXCEPTION_MESSAGE * 4]


def _innermost_function(exc: BaseException) -> str:
    """The function the exception was raised in (``Source``), without formatting the
    traceback."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name


def _text_size(failure: Failure) -> int:
    return len(failure.message) + len(failure.stack_trace)


CustomPolicy = Callable[["Failure", dict[str, str], "Decision"], "Decision"]
"""A user's recoverability policy (``@endpoint.recoverability_policy``): from a message's
failure record, its headers and the built-in policy's decision, the decision to carry out
(docs/recoverability.md)."""


class RecoverabilityPolicy:
    """Decides what a message's next delivery does, from its failures and headers; a
    ``custom`` policy, when given, has the last word (its faults fall back to the built-in
    decision, logged)."""

    def __init__(
        self,
        *,
        immediate_retries: int,
        delayed_retries: int = 0,
        delayed_retry_delay: float = 10.0,
        give_up_after: float = 86_400.0,
        unrecoverable: tuple[type[BaseException], ...] = (),
        custom: CustomPolicy | None = None,
    ) -> None:
        self.custom = custom
        self.immediate_retries = immediate_retries
        self.delayed_retries = delayed_retries
        self.delayed_retry_delay = delayed_retry_delay
        self.give_up_after = give_up_after
        self.unrecoverable = DEFAULT_UNRECOVERABLE + tuple(unrecoverable)

    def is_unrecoverable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.unrecoverable)

    def decide(
        self, failure: Failure, headers: dict[str, str], now: datetime | None = None
    ) -> Decision:
        decision = self.built_in(failure, headers, now)
        if self.custom is None:
            return decision
        try:
            chosen = self.custom(failure, headers, decision)
        except Exception as exc:
            log.error("recoverability_policy_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                      using=decision.action.value)
            return decision
        if not isinstance(chosen, Decision) or not isinstance(chosen.action, Action):
            log.error("recoverability_policy_failed", using=decision.action.value,
                      error=f"returned {chosen!r:.200}, not a Decision")
            return decision
        return chosen

    def built_in(
        self, failure: Failure, headers: dict[str, str], now: datetime | None = None
    ) -> Decision:
        """The built-in decision: NServiceBus's default policy."""
        if failure.discard_reason is not None:
            return Decision(Action.DISCARD)
        if failure.requested_delay is not None:
            return Decision(Action.DELAYED_RETRY, failure.requested_delay)
        if failure.unrecoverable:
            return Decision(Action.ERROR_QUEUE)
        immediate = _pick(failure.limits.immediate_retries, self.immediate_retries)
        if failure.attempts <= immediate:
            return Decision(Action.IMMEDIATE_RETRY)
        delayed = _pick(failure.limits.delayed_retries, self.delayed_retries)
        done = delayed_retries_done(headers)
        if done < delayed and not self._too_old(headers, now or utc_now()):
            return Decision(Action.DELAYED_RETRY, self.delayed_retry_delay * (done + 1))
        return Decision(Action.ERROR_QUEUE)

    def _too_old(self, headers: dict[str, str], now: datetime) -> bool:
        first = headers.get(RetryHeaders.TIMESTAMP)
        if not first:
            return False
        try:
            return (now - from_wire_time(first)).total_seconds() > self.give_up_after
        except ValueError:
            return False


def _pick(override: int | None, default: int) -> int:
    return default if override is None else override


def delayed_retries_done(headers: dict[str, str]) -> int:
    try:
        return int(headers.get(RetryHeaders.RETRIES, "0"))
    except ValueError:
        return 0


def delayed_retry_headers(message: TransportMessage) -> dict[str, str]:
    """Headers of the copy stored for the next delayed retry."""
    headers = dict(message.headers)
    headers[RetryHeaders.RETRIES] = str(delayed_retries_done(message.headers) + 1)
    headers.setdefault(RetryHeaders.TIMESTAMP, to_wire_time(utc_now()))
    return headers
