"""The README's picture, taken from today's page: the Chat tab with a reply, and the Image tab with an image.

Written to test-artifacts/screenshots/readme.png on every run; copied to assets/screenshot.png (the README's
hero) when ``UPDATE_README_SCREENSHOT=1``. Runs on the session's app process (tests/browser/conftest.py).
"""

from __future__ import annotations

import io
import os
import shutil

import pytest
from PIL import Image
from support.browser import (
    README_SCREENSHOT,
    REPLY_TIMEOUT_MS,
    SCREENSHOTS,
    WATCH_CHAT_JS,
    _close_accordion,
    _open_accordion,
    _retry,
    _send,
    _set_number,
    _wait_ready,
    _wait_reply,
    open_page,
)

pytestmark = pytest.mark.browser

# The page from its top to the bottom of the element ``selector`` names (plus a margin), in page coordinates.
BOTTOM_JS = "sel => document.querySelector(sel).getBoundingClientRect().bottom + window.scrollY + 16"
TOP_JS = "sel => document.querySelector(sel).getBoundingClientRect().top + window.scrollY - 8"


def _clip(page, top: float, bottom: float) -> Image.Image:
    width = page.viewport_size["width"]
    shot = page.screenshot(full_page=True, clip={"x": 0, "y": top, "width": width, "height": bottom - top})
    return Image.open(io.BytesIO(shot)).convert("RGB")


def test_the_readme_picture_shows_a_reply_and_an_image(browser, app_url):
    context, page = open_page(browser, app_url, "en-US")
    try:
        _wait_ready(page)
        page.evaluate(WATCH_CHAT_JS)
        _open_accordion(page, "Sampling and system prompt")
        _set_number(page, "number input for Max new tokens", 40)  # a reply that fits the picture whole
        _close_accordion(page, "Sampling and system prompt")
        _send(page, "Write a haiku about compilers.")
        reply = _wait_reply(page, 1)
        for _ in range(5):  # the random demo model sometimes ends at once; the picture wants words
            if reply:
                break
            _retry(page)
            reply = _wait_reply(page, 1)
        assert reply
        page.wait_for_function("() => document.querySelector('#chat-stats').innerText.includes('tokens/s')")
        page.evaluate("() => window.scrollTo(0, 0)")
        chat = _clip(page, 0, page.evaluate(BOTTOM_JS, "#context-meter"))

        page.locator("#image-tab-button").click()
        page.locator("#image-prompt textarea").fill("a lighthouse at dusk, watercolor")
        steps = page.locator("#image-steps input[type=number]")
        steps.fill("8")
        steps.press("Tab")
        page.locator("#generate").click()
        page.locator("#gallery .thumbnail-item img").first.wait_for(timeout=REPLY_TIMEOUT_MS)
        page.locator("#stop-image").wait_for(state="hidden")
        page.wait_for_function("() => { const i = document.querySelector('#image-out img');"
                               " return i && i.complete && i.naturalWidth > 0; }")
        page.evaluate("() => window.scrollTo(0, 0)")
        image = _clip(page, page.evaluate(TOP_JS, ".tab-container"), page.evaluate(BOTTOM_JS, "#image-out"))

        picture = Image.new("RGB", (chat.width, chat.height + image.height), "white")
        picture.paste(chat, (0, 0))
        picture.paste(image, (0, chat.height))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / "readme.png"
        picture.save(path, optimize=True)
        if os.environ.get("UPDATE_README_SCREENSHOT") == "1":
            shutil.copyfile(path, README_SCREENSHOT)
    finally:
        context.close()
