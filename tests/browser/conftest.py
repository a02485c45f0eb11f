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
from support.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, RECORD_PROGRESS_JS, WATCH_CHAT_JS, running_app

HERE = Path(__file__).parent


def _is_browser_test(item) -> bool:
    return HERE in Path(item.fspath).parents


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marker
def pytest_collection_modifyitems(items):
    for item in items:
        if _is_browser_test(item):
            item.add_marker(pytest.mark.browser)
            # Under pytest-xdist's --dist loadgroup every browser test runs in one worker: one Chromium, one app.
            item.add_marker(pytest.mark.xdist_group("browser"))


def pytest_collection_finish(session):
    """Under --dist loadgroup, refuse to run browser tests that xdist did not put in the browser group: the tests
    of a module share one page, in the order they are written, so split over two workers they fail at random.

    pytest-xdist groups by appending ``@<group>`` to each item's node id (``item._nodeid``); pytest 9.2 derives
    the node id from another attribute, so there the append is lost and nothing is grouped (requirements-dev.in
    pins pytest below 9.2 for that)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        if _is_browser_test(item) and not item.nodeid.endswith("@browser"):
            item.stash[UNGROUPED] = True


UNGROUPED = pytest.StashKey[bool]()


def pytest_runtest_setup(item):
    if item.stash.get(UNGROUPED, False):
        pytest.fail("this browser test is not in the xdist group 'browser': this pytest-xdist cannot group under "
                    "this pytest, so two workers would share one module's page; install the dev lock (pip install "
                    "-r requirements-dev.txt)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed browser test leaves a picture of its page as it was then: test-artifacts/failures/<test>.png."""
    report = yield
    page = item.funcargs.get("page") if hasattr(item, "funcargs") else None
    if report.failed and page is not None and not page.is_closed():
        folder = ARTIFACTS / "failures"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            page.screenshot(path=str(folder / f"{item.name}.png"), full_page=True)
        except Exception as exc:  # noqa: BLE001 - the test's own failure is the report; this is a picture of it
            report.sections.append(("failure screenshot", f"not taken: {exc}"))
    return report


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
