"""Actors log in the driver's format (they have no terminal of their own)."""

from __future__ import annotations

import io
import sys

import pytest

from endpoint_runtime.actors.cluster import actor_log_format


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_actors_follow_the_drivers_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENDPOINT_RUNTIME_LOG_FORMAT", raising=False)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert actor_log_format() == {"ENDPOINT_RUNTIME_LOG_FORMAT": "console"}
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert actor_log_format() == {"ENDPOINT_RUNTIME_LOG_FORMAT": "json"}


def test_a_chosen_format_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_LOG_FORMAT", "json")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert actor_log_format() == {"ENDPOINT_RUNTIME_LOG_FORMAT": "json"}
