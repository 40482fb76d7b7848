"""Starting a local Ray again when its node timed out during startup (pure logic: the start
and shutdown are functions of the test; ``ensure_ray`` passes Ray's own)."""

from __future__ import annotations

import pytest

from endpoint_runtime.runtime.actors.cluster import start_with_retries

TIMED_OUT = ("The current node timed out during startup. This could happen because some of "
             "the raylet failed to startup or the GCS has become overloaded.")


def test_a_start_that_timed_out_is_shut_down_and_tried_again() -> None:
    calls: list[str] = []

    def start() -> None:
        calls.append("start")
        if calls.count("start") == 1:
            raise Exception(TIMED_OUT)  # Ray raises a bare Exception

    start_with_retries(start, lambda: calls.append("shutdown"))
    assert calls == ["start", "shutdown", "start"]


def test_other_errors_and_the_last_timeout_are_raised() -> None:
    calls: list[str] = []

    def failing() -> None:
        calls.append("start")
        raise RuntimeError("not a timeout")

    with pytest.raises(RuntimeError, match="not a timeout"):
        start_with_retries(failing, lambda: calls.append("shutdown"))
    assert calls == ["start"]

    def timing_out() -> None:
        raise Exception(TIMED_OUT)

    with pytest.raises(Exception, match="timed out during startup"):
        start_with_retries(timing_out, lambda: None, attempts=2)
