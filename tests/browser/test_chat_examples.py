"""A chat example, clicked, is sent: its reply and stats come as for a typed message (headless Chromium).

Screenshot: test-artifacts/screenshots/chat-example-sent.png.
"""

from __future__ import annotations

import pytest
from support.browser import REPLY_TIMEOUT_MS, _shot, _wait_ready

from ui.chat_tab import EXAMPLE_PROMPTS

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
