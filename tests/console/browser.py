"""A real headless Chromium (Debian's ``chromium``, installed by bin/dev) driven by
Playwright, with a fresh profile per test.

Screenshots of the pages go to a temporary directory, so a test run leaves the checkout
clean; with ``CONSOLE_SCREENSHOTS=docs`` they replace the ones in docs/console/ (how
docs/console.md's pictures are refreshed)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import BrowserContext, Page, async_playwright

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
SCREENSHOTS_VARIABLE = "CONSOLE_SCREENSHOTS"


def _require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: bin/dev installs Debian's chromium when run as "
                    "root (apt-get install chromium)")


@pytest.fixture
async def browser() -> AsyncIterator[BrowserContext]:
    _require_chromium()
    with tempfile.TemporaryDirectory(prefix="console-chromium-") as profile:
        async with async_playwright() as playwright:
            # headless=True adds --headless; the profile is --user-data-dir.
            context = await playwright.chromium.launch_persistent_context(
                profile, executable_path=str(CHROMIUM), headless=True, args=FLAGS,
                viewport={"width": 1280, "height": 800})
            context.set_default_timeout(10_000)
            yield context
            await context.close()


def screenshots_folder() -> Path:
    """docs/console/ when ``CONSOLE_SCREENSHOTS=docs``, else a folder of the system's
    temporary directory."""
    if os.environ.get(SCREENSHOTS_VARIABLE) == "docs":
        return DOCS_SCREENSHOTS
    return Path(tempfile.gettempdir()) / "endpoint-runtime-console-screenshots"


async def screenshot(page: Page, name: str, *, full_page: bool = False) -> Path:
    folder = screenshots_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    await page.screenshot(path=str(path), full_page=full_page)
    return path
