"""The browser fixtures of the dashboard's browser tests (``test_dashboard_browser.py``, ``test_dashboard_views.py``):
Debian's Chromium driven by Playwright, one browser per module and a fresh page per test."""

from __future__ import annotations

import pytest
from test_dashboard_browser import CHROMIUM, CHROMIUM_FLAGS, WAIT_MS


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page; any uncaught JavaScript error fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
