"""The browser tests' fixtures: Chromium, one app process for the session, a page per module.

Needs Debian's ``chromium`` at /usr/bin/chromium (or $CHROMIUM_PATH) and the Python package
``playwright`` (no ``playwright install``: the system browser is used). Without them the tests are
skipped, except in CI (``CI`` set), where that is a failure. Every test in this folder is marked
``browser`` here, so the fast loop (``-m "not slow and not browser"``) leaves them all out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.browser import CHROMIUM, CHROMIUM_ARGS, RECORD_PROGRESS_JS, WATCH_CHAT_JS, running_app


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)
            # Under pytest-xdist's --dist loadgroup every browser test runs in one worker: one Chromium, one app.
            item.add_marker(pytest.mark.xdist_group("browser"))


@pytest.fixture(scope="session")
def chromium() -> str:
    """The browser binary; skip (fail in CI) with the reason when it or playwright is missing."""
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"Chromium is not at {CHROMIUM} (apt-get install chromium, or set CHROMIUM_PATH)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the Python package playwright is not installed (pip install -r requirements-dev.txt)")
    if missing:
        reason = "browser tests need a browser: " + "; ".join(missing)
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture(scope="session")
def app_url(chromium) -> str:
    """One app process on the demo models for every browser module that only needs it running."""
    with running_app() as url:
        yield url


@pytest.fixture(scope="module")
def browser(chromium):
    """Playwright's sync API runs an event loop on this thread while it is open: per module, so the tests
    after the browser ones (asyncio.run, gradio_client, the mcp client) find no loop running."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def context(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(30_000)
    yield context
    context.close()


@pytest.fixture(scope="module")
def page(context, app_url):
    """The main tab, opened as soon as the server answers (warm-up may still be running then)."""
    page = context.new_page()
    page.goto(app_url)
    page.locator("#status-bar").wait_for()
    page.evaluate(WATCH_CHAT_JS)
    page.evaluate(RECORD_PROGRESS_JS)
    return page
