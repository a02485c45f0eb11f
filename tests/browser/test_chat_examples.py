"""A chat example, clicked, is sent: its reply and stats come as for a typed message (headless Chromium).

Screenshot: test-artifacts/screenshots/chat-example-sent.png.
"""

from __future__ import annotations

import pytest
from support.browser import REPLY_TIMEOUT_MS, WATCH_CHAT_JS, _shot, _wait_ready, _wait_reply, open_page

from ui.chat_tab import EXAMPLE_PROMPTS
from ui.i18n import say, speaking
from ui.image_tab import IMAGE_EXAMPLES

pytestmark = pytest.mark.browser


def test_clicking_an_example_sends_it(page):  # noqa: F811 - the fixture
    _wait_ready(page)
    page.get_by_role("tab", name="Chat").click()
    page.get_by_role("button", name="New chat").click()
    page.locator("#chatbot button.example").first.click()
    page.locator("#chatbot .message-row.user-row", has_text=EXAMPLE_PROMPTS[0]).wait_for(timeout=REPLY_TIMEOUT_MS)
    page.wait_for_function("() => document.querySelectorAll('#chatbot .message-row.bot-row').length >= 1"
                           " && /new tokens/.test(document.querySelector('#chat-stats')?.innerText || '')",
                           timeout=REPLY_TIMEOUT_MS)
    assert page.locator("#chat-tab textarea").first.input_value() == ""  # sent, not left in the box
    _shot(page, "chat-example-sent", full_page=False)


def test_the_examples_are_in_the_pages_language_and_send_what_they_show(browser, app_url):
    with speaking("ar"):
        chat_examples, image_examples = [say(e) for e in EXAMPLE_PROMPTS], [say(e) for e in IMAGE_EXAMPLES]
    context, page = open_page(browser, app_url, "ar")
    try:
        chips = page.locator("#chatbot button.example")
        page.wait_for_function("first => document.querySelector('#chatbot button.example')?.innerText.trim() === first",
                               arg=chat_examples[0])
        assert [c.strip() for c in chips.all_inner_texts()] == chat_examples
        page.locator("#image-tab-button").click()
        shown = page.locator("#image-tab .gallery-item, #image-tab button.gallery-item")
        page.get_by_text(image_examples[1], exact=True).wait_for()
        assert all(page.get_by_text(e, exact=True).count() for e in image_examples), shown.all_inner_texts()
        page.get_by_text(image_examples[1], exact=True).click()
        page.wait_for_function("text => document.querySelector('#image-prompt textarea').value === text",
                               arg=image_examples[1])
        _shot(page, "examples-ar-image", full_page=False)
        page.locator("#chat-tab-button").click()
        page.evaluate(WATCH_CHAT_JS)
        page.evaluate("window.__busySeen = false")
        chips.nth(1).click()
        page.locator("#chatbot .message-row.user-row", has_text=chat_examples[1]).wait_for(timeout=REPLY_TIMEOUT_MS)
        _wait_reply(page, 1)
        _shot(page, "examples-ar-chat", full_page=False)
    finally:
        context.close()
