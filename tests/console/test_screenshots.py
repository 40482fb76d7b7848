"""The browser tests leave the checkout clean: screenshots go to docs/console/ only when
``CONSOLE_SCREENSHOTS=docs`` asks."""

from __future__ import annotations

import pytest

from tests.console.browser import DOCS_SCREENSHOTS, SCREENSHOTS_VARIABLE, screenshots_folder


def test_screenshots_go_to_docs_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SCREENSHOTS_VARIABLE, raising=False)
    assert not screenshots_folder().is_relative_to(DOCS_SCREENSHOTS.parents[1])  # the checkout
    monkeypatch.setenv(SCREENSHOTS_VARIABLE, "1")
    assert screenshots_folder() != DOCS_SCREENSHOTS
    monkeypatch.setenv(SCREENSHOTS_VARIABLE, "docs")
    assert screenshots_folder() == DOCS_SCREENSHOTS
