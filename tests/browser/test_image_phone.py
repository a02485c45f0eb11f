"""On a phone (390x844), Generate brings the picture into view: the live preview a visitor came for is on the
screen while the run is on, not under the fold.

Runs on the session's app process (tests/browser/conftest.py); the ``image`` gate holds the run at a denoising
step while the page is read. Screenshot: test-artifacts/screenshots/image-phone-mid-run.png.
"""

from __future__ import annotations

import pytest
from support.browser import SEEN_JS, _shot, _wait_image_sizes_ready, held, open_page, stop_held_image

pytestmark = pytest.mark.browser

# The element's box against the window: wholly inside it, top and bottom.
IN_VIEW_JS = """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
  return {top: r.top, bottom: r.bottom, height: innerHeight, inside: r.top >= -1 && r.bottom <= innerHeight + 1}; }"""


@pytest.mark.parametrize("locale", ["en-US", "ar"])
def test_generate_on_a_phone_brings_the_preview_into_view(browser, app_url, locale):
    context, page = open_page(browser, app_url, locale, phone=True)
    try:
        _wait_image_sizes_ready(page, app_url)
        # As a visitor on a phone: the prompt typed at the top of the tab, then Generate right under it.
        page.evaluate("() => window.scrollTo(0, 0)")
        page.locator("#image-prompt textarea").fill("a lighthouse at dusk")
        page.locator("#generate").scroll_into_view_if_needed()
        _shot(page, f"image-phone-before-{locale}", full_page=False)
        assert not page.evaluate(IN_VIEW_JS, "#image-out")["inside"], "the picture was in view before Generate"
        with held(app_url, "image", after_steps=2):  # the run waits at its second step while the page is read
            page.locator("#generate").click()
            page.locator("#image-out img").wait_for()  # the first preview frame
            page.wait_for_function(f"() => ({IN_VIEW_JS})('#image-out').inside")
            _shot(page, f"image-phone-mid-run-{locale}", full_page=False)
            seen = page.evaluate(IN_VIEW_JS, "#image-out")
            assert seen["inside"], seen
            assert page.evaluate(IN_VIEW_JS, "#stop-image")["inside"], "Stop went out of view"
            # the progress is written once: the bar's line ("step 1/4 · ~0.3 s left - 25.0%"), not a second one
            lines = page.evaluate(f"() => [...document.querySelectorAll('#image-progress .progress-level-inner, "
                                  f"#image-progress .progress-text')].filter({SEEN_JS}).map(e => e.innerText.trim())")
            assert len(lines) == 1 and "1/" in lines[0], lines
            stop_held_image(page)
    finally:
        context.close()
