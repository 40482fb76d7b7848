"""Failure groups (pure): what is masked, which frames count, and that two exception types
never share a group."""

from __future__ import annotations

import traceback

import pytest

from endpoint_runtime.wire.failure_groups import failure_group, normalise, top_frames


@pytest.mark.parametrize(("message", "title"), [
    ("card declined for 4711", "card declined for <n>"),
    ("card declined for 4712\nissuer said: 51", "card declined for <n>"),
    ("order 'ord-17' of \"acme\" failed", "order '<…>' of \"<…>\" failed"),
    ("saga 3f2a9c1e-1234-4abc-8def-0123456789ab not found", "saga <id> not found"),
    ("object at 0x7f3a2b1c9d40 is gone", "object at <id> is gone"),
    ("timeout after 30s (limit 100ms), retry -3", "timeout after <n> (limit <n>), retry <n>"),
    ("amount 19.95 exceeds 1,000.00", "amount <n> exceeds <n>"),
    ("utf8 codec over http2 on ipv6", "utf8 codec over http2 on ipv6"),  # words keep digits
    ("", ""),
])
def test_normalise_masks_what_varies_between_messages_of_one_cause(
        message: str, title: str) -> None:
    assert normalise(message) == title


def test_twenty_two_ids_are_one_group_and_another_exception_type_is_another() -> None:
    keys = {failure_group("billing.CardDeclined", f"card declined for {4700 + i}", None).key
            for i in range(22)}
    assert len(keys) == 1
    other = failure_group("billing.GatewayDown", "card declined for 4700", None)
    assert other.key not in keys
    assert failure_group(None, "card declined for 1", None).key not in keys | {other.key}


def _trace(raiser: object) -> str:
    try:
        raiser()  # type: ignore[operator]
    except ValueError as exc:
        return "".join(traceback.format_exception(exc))
    raise AssertionError("did not raise")


def _charge() -> None:
    raise ValueError("card declined for 1")


def _ship() -> None:
    raise ValueError("card declined for 1")


def test_the_innermost_frames_count_their_line_numbers_do_not() -> None:
    trace = _trace(_charge)
    assert top_frames(trace)[-2:] == ["test_failure_groups.py:_trace",
                                      "test_failure_groups.py:_charge"]
    moved = trace.replace(", line ", ", line 1")  # every line number changed
    assert failure_group("builtins.ValueError", "card declined for 1", moved) == failure_group(
        "builtins.ValueError", "card declined for 2", trace)
    # The same exception and message raised elsewhere is another cause.
    assert failure_group("builtins.ValueError", "x", _trace(_ship)).key != failure_group(
        "builtins.ValueError", "x", trace).key


def test_dotnet_frames_and_a_trace_cut_at_its_head_still_group() -> None:
    dotnet = ("System.Exception: declined\n   at Billing.Charge.Handle(Message m) in "
              "C:\\src\\Charge.cs:line 42\n   at NServiceBus.Invoke(Object o)")
    assert top_frames(dotnet) == ["Billing.Charge.Handle", "NServiceBus.Invoke"]
    trace = _trace(_charge)
    cut = trace[len(trace) // 3:]  # the runtime keeps a long trace's tail
    assert top_frames(cut)[-1] == top_frames(trace)[-1]
