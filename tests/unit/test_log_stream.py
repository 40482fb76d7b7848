"""A log line that cannot be written never fails the caller (e.g. a closed stderr)."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from endpoint_runtime.logging import StderrLogger, whole_lines_output


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


def test_a_line_logged_while_another_thread_is_mid_line_stays_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a Ray driver, Ray's thread prints an actor's line (its text, then its newline, two
    writes) while the main thread logs: the logged JSON line once landed inside the actor's
    line, so neither parsed (an ``endpoint_final_status`` line lost to
    ``endpoint-runtime run``'s reader in CI). With the driver's output made whole-line
    (``whole_lines_output``, called by ``ensure_ray``) each comes out whole."""
    written = io.StringIO()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", written)
    whole_lines_output()
    mid_line, logged = threading.Event(), threading.Event()

    def ray_printing_an_actor_line() -> None:
        sys.stderr.write('{"event": "receiver_started"}')  # print's first write
        mid_line.set()
        logged.wait(5)
        sys.stderr.write("\n")  # and its second

    printer = threading.Thread(target=ray_printing_an_actor_line)
    printer.start()
    assert mid_line.wait(5)
    StderrLogger().info('{"event": "endpoint_final_status"}')
    logged.set()
    printer.join(5)
    assert written.getvalue().splitlines() == [
        '{"event": "endpoint_final_status"}', '{"event": "receiver_started"}']
    whole_lines_output()  # once: not wrapped twice
    assert sys.stderr.stream is written  # type: ignore[attr-defined]
