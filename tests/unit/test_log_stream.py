"""A log line that cannot be written never fails the caller (e.g. a closed stderr)."""

from __future__ import annotations

import io
import sys

import pytest

from endpoint_runtime.logging import StderrLogger


def test_lines_go_to_the_current_stderr_and_a_closed_one_is_no_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger = StderrLogger()
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logger.warning("one")
    monkeypatch.setattr(sys, "stderr", second)  # replaced after the logger was made
    logger.error("two")
    assert (first.getvalue(), second.getvalue()) == ("one\n", "two\n")
    second.close()
    logger.info("three")  # dropped, not raised
