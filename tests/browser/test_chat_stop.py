"""A Stop pressed in a reply's first moment keeps the reply: the tokens made so far, or a "Stopped before any
text" note, with Retry and Undo under it; the stats line never shows the previous reply's numbers meanwhile.

Runs on the session's app process (tests/browser/conftest.py); the ``chat`` gate holds the reply at its first
decode step, so the Stop lands before any word reached the page, however slow the machine.
"""

from __future__ import annotations

import pytest
from support.browser import (
    SEEN_JS,
    WATCH_CHAT_JS,
    _bot_texts,
    _send,
    _set_number,
    _short_replies,
    _shot,
    _user_texts,
    _wait_ready,
    _wait_reply,
    held,
    open_page,
    stop_held_reply,
)

pytestmark = pytest.mark.browser


def _seen(page, selector: str) -> bool:
    """One element that ``selector`` names, in the window and not hidden by opacity or visibility."""
    return page.evaluate(f"""sel => [...document.querySelectorAll(sel)].some(e => ({SEEN_JS})(e) && (() => {{
        const r = e.getBoundingClientRect();
        return r.width > 0 && r.height > 0 && r.bottom > 0 && r.top < innerHeight; }})())""", selector)


def test_a_stop_in_the_first_moment_keeps_the_reply_with_retry(browser, app_url):
    context, page = open_page(browser, app_url, "en-US")
    try:
        _wait_ready(page)
        page.evaluate(WATCH_CHAT_JS)
        _short_replies(page)
        # Seeded: the demo model's random words include <|im_end|>, and unseeded about 1 reply in 20 ended by
        # itself within the steps a Stop needs, so the Stop found no reply to stop. With this seed both replies
        # run to the token limit (24).
        _set_number(page, "Seed (-1 = random)", 3, within="#chat-tab")
        _send(page, "Say something first.")
        _wait_reply(page, 1)
        page.wait_for_function("() => document.querySelector('#chat-stats').innerText.includes('tokens/s')")
        before = page.locator("#chat-stats").inner_text()
        assert page.locator("#chatbot button[aria-label=Retry]").count() == 1

        with held(page.url, "chat", after_steps=1) as hold_again:  # the reply waits before its first decode step
            _send(page, "Tell me a long story about compilers.")
            stop = page.locator("#chat-tab button.stop-button")
            stop.wait_for()
            # while the new reply runs, the stats line does not show the previous reply's numbers (a change of
            # the line's text alone could be the pending event's progress drawn over the old numbers)
            page.wait_for_function("() => !document.querySelector('#chat-stats').innerText.includes('tokens/s')")
            assert before not in page.locator("#chat-stats").inner_text()
            stop_held_reply(page, stop.click, hold_again)
        stop.wait_for(state="hidden")
        # the stopped reply: its bubble under the second message, with its stats marked stopped
        page.wait_for_function("() => document.querySelectorAll('#chatbot .message-row.bot-row').length === 2")
        page.locator("#chat-stats", has_text="stopped").wait_for()
        page.locator("#chatbot button[aria-label=Retry]").last.scroll_into_view_if_needed()
        _shot(page, "chat-stopped-at-once", full_page=False)
        assert len(_user_texts(page)) == 2
        last = _bot_texts(page)[-1]
        assert last, "the stopped reply's bubble is empty"
        rows = page.locator("#chatbot .message-row.bot-row")
        text = rows.last.inner_text()
        assert "Stopped before any text" in text or len(text.strip()) > 0
        # Retry and Undo under the stopped reply, where the eye sees them
        assert _seen(page, "#chatbot button[aria-label=Retry]")
        assert _seen(page, "#chatbot button[aria-label=Undo]")
        # the message box says again what it is for (ChatInterface empties its placeholder while a reply runs)
        page.wait_for_function("() => document.querySelector('#chat-tab textarea').placeholder !== ''")

        # Retry answers the same message again in its place
        page.evaluate("window.__busySeen = false")
        page.locator("#chatbot button[aria-label=Retry]").last.click()
        _wait_reply(page, 2)
        assert len(_user_texts(page)) == 2
        assert "Stopped before any text" not in rows.last.inner_text()
    finally:
        context.close()
