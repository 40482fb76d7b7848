"""Actors log in the driver's format (they have no terminal of their own), with colour codes
only when the driver's output is a terminal."""

from __future__ import annotations

import io
import sys

import pytest

from endpoint_runtime.logging import use_colors
from endpoint_runtime.runtime.actors.cluster import actor_log_format


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_chosen_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENDPOINT_RUNTIME_LOG_FORMAT", raising=False)
    monkeypatch.delenv("ENDPOINT_RUNTIME_LOG_COLORS", raising=False)


def test_actors_follow_the_drivers_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert actor_log_format() == {"ENDPOINT_RUNTIME_LOG_FORMAT": "console",
                                  "ENDPOINT_RUNTIME_LOG_COLORS": "1"}
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert actor_log_format() == {"ENDPOINT_RUNTIME_LOG_FORMAT": "json",
                                  "ENDPOINT_RUNTIME_LOG_COLORS": "0"}


def test_a_chosen_format_wins_and_colours_still_follow_the_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_LOG_FORMAT", "console")
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # piped: console lines, no colour codes
    assert actor_log_format() == {"ENDPOINT_RUNTIME_LOG_FORMAT": "console",
                                  "ENDPOINT_RUNTIME_LOG_COLORS": "0"}
    monkeypatch.setenv("ENDPOINT_RUNTIME_LOG_FORMAT", "json")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert actor_log_format() == {"ENDPOINT_RUNTIME_LOG_FORMAT": "json",
                                  "ENDPOINT_RUNTIME_LOG_COLORS": "1"}


def test_an_actor_takes_the_drivers_colour_choice_over_its_own_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # an actor's stderr is a file
    monkeypatch.setenv("ENDPOINT_RUNTIME_LOG_COLORS", "1")
    assert use_colors()
    monkeypatch.setenv("ENDPOINT_RUNTIME_LOG_COLORS", "0")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert not use_colors()

