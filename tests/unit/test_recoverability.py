from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from endpoint_runtime.chain.recoverability.error_queue import error_copy
from endpoint_runtime.chain.recoverability.policy import (
    CUT_STACK_TRACE,
    Action,
    DiscardMessage,
    ErrorHeaders,
    FailedMessages,
    Failure,
    RecoverabilityPolicy,
    RetryHeaders,
    RetryLater,
    RetryLimits,
)
from endpoint_runtime.errors import MessageDecodeError
from endpoint_runtime.wire.messages import Headers, TransportMessage, to_wire_time

POLICY = RecoverabilityPolicy(immediate_retries=2, delayed_retries=3, delayed_retry_delay=10)


def failures(times: int, exc: BaseException | None = None, **limits: int) -> Failure:
    record = FailedMessages()
    native = uuid.uuid4()
    failure = None
    for _ in range(max(times, 1)):
        failure = record.record(native, exc or ValueError("boom"),
                                unrecoverable=POLICY.is_unrecoverable(exc or ValueError()),
                                limits=RetryLimits(**limits))
    assert failure is not None
    return failure


def test_immediate_retries_then_delayed_retries_with_growing_delays() -> None:
    assert POLICY.decide(failures(2), {}).action is Action.IMMEDIATE_RETRY
    third = POLICY.decide(failures(3), {})
    assert (third.action, third.delay) == (Action.DELAYED_RETRY, 10)
    second_delayed = POLICY.decide(failures(3), {RetryHeaders.RETRIES: "1"})
    assert second_delayed.delay == 20
    exhausted = POLICY.decide(failures(3), {RetryHeaders.RETRIES: "3"})
    assert exhausted.action is Action.ERROR_QUEUE


def test_delayed_retries_give_up_a_day_after_the_first() -> None:
    old = to_wire_time(datetime.now(UTC) - timedelta(days=1, minutes=1))
    recent = to_wire_time(datetime.now(UTC) - timedelta(hours=23))
    headers = {RetryHeaders.RETRIES: "1"}
    decision = POLICY.decide(failures(3), {**headers, RetryHeaders.TIMESTAMP: old})
    assert decision.action is Action.ERROR_QUEUE
    decision = POLICY.decide(failures(3), {**headers, RetryHeaders.TIMESTAMP: recent})
    assert decision.action is Action.DELAYED_RETRY


def test_unrecoverable_requests_and_per_handler_limits() -> None:
    decode_error = MessageDecodeError("T", b"x", ValueError("bad"))
    assert POLICY.decide(failures(1, decode_error), {}).action is Action.ERROR_QUEUE
    later = POLICY.decide(failures(1, RetryLater(timedelta(seconds=3))), {})
    assert (later.action, later.delay) == (Action.DELAYED_RETRY, 3)
    assert POLICY.decide(failures(1, DiscardMessage("gone")), {}).action is Action.DISCARD
    # A handler that allows no immediate and no delayed retry: error queue at once.
    strict = failures(1, immediate_retries=0, delayed_retries=0)
    assert POLICY.decide(strict, {}).action is Action.ERROR_QUEUE


def test_failure_counts_are_an_lru() -> None:
    record = FailedMessages(capacity=2)
    ids = [uuid.uuid4() for _ in range(3)]
    for native in ids:
        record.record(native, ValueError(), unrecoverable=False)
    assert record.get(ids[0]) is None
    assert record.get(ids[2]) is not None


@pytest.mark.parametrize("length", [10, 20_000])
def test_error_copy_has_the_error_headers_and_no_ttbr(length: int) -> None:
    message = TransportMessage(
        native_id=uuid.uuid4(), seq=1, raw_headers="{}", body=b"{}",
        headers={Headers.MESSAGE_ID: "m", Headers.TIME_TO_BE_RECEIVED: "00:01:00"},
    )
    failure = failures(1, ValueError("x" * length))
    copy = error_copy(message, failure, "public.sales", "sales")
    assert copy.time_to_be_received is None
    assert Headers.TIME_TO_BE_RECEIVED not in copy.headers
    assert copy.headers[ErrorHeaders.FAILED_QUEUE] == "public.sales"
    assert copy.headers[ErrorHeaders.EXCEPTION_TYPE] == "builtins.ValueError"
    assert len(copy.headers[ErrorHeaders.MESSAGE]) == min(length, 16_384)
    assert set(ErrorHeaders.ALL) <= set(copy.headers)
    assert copy.headers[Headers.PROCESSING_ENDPOINT] == "sales"


def test_a_trace_kept_after_the_record_was_cut_stays_cut_and_is_counted() -> None:
    record = FailedMessages(text_budget=100)
    first, second = uuid.uuid4(), uuid.uuid4()
    record.record(first, ValueError("x" * 80), unrecoverable=False, with_trace=False)
    record.record(second, ValueError("y" * 80), unrecoverable=False, with_trace=False)
    try:
        raise ValueError("z")
    except ValueError as exc:
        record.keep_trace(first, exc)  # first was cut when second came over the budget
    kept = record.get(first)
    assert kept is not None
    assert 0 < len(kept.stack_trace) <= CUT_STACK_TRACE
    assert kept.stack_trace.rstrip().endswith("ValueError: z")
    held = [record.get(i) for i in (first, second)]
    assert record.text_size == sum(len(f.message) + len(f.stack_trace) for f in held if f)
