"""axe-core finds nothing critical or serious on any tab, in English and in Arabic, before and after a
reply and an image; the fold of a reply's bubble still opens and closes by mouse and keyboard after the
page's accessibility repairs (ui/accessibility.py).

axe-core comes from PyPI (``axe-playwright-python``, which ships axe.min.js); it runs inside the page.
Runs on the session's app process (tests/browser/conftest.py).
"""

from __future__ import annotations

import json

import pytest
from support.browser import _generate, _send, _short_replies, _shot, _wait_ready, _wait_reply, open_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TABS = ("#chat-tab-button", "#image-tab-button", "#qa-tab-button")


def serious(page) -> list[tuple[str, str, list]]:
    """axe-core's critical and serious findings on the page as it is now: (rule, impact, first targets)."""
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page).response["violations"]
    return [(v["id"], v["impact"], [n["target"] for n in v["nodes"][:3]]) for v in found
            if v["impact"] in ("critical", "serious")]


@pytest.mark.parametrize("form", ["desktop", "phone"])
@pytest.mark.parametrize("locale", ["en-US", "ar"])
def test_axe_finds_nothing_serious_on_any_tab(browser, app_url, locale, form):
    context, page = open_page(browser, app_url, locale, phone=form == "phone")
    try:
        _wait_ready(page) if locale == "en-US" else page.locator("#warmup-state").wait_for()
        for tab in TABS:
            page.locator(tab).click()
            page.wait_for_timeout(300)  # the tab's components render
            assert serious(page) == [], (locale, form, tab)
        # Lighthouse's image-redundant-alt (minor to axe): no footer icon repeats its button's words.
        assert page.locator('footer button > img:not([alt=""])').count() == 0
    finally:
        context.close()


def test_axe_finds_nothing_serious_after_a_reply_and_an_image(page):
    _wait_ready(page)
    page.locator("#chat-tab-button").click()
    _short_replies(page)
    bots = page.locator("#chatbot .message-row.bot-row").count()
    # Gradio announces a finished event to screen readers in a hidden live region for a moment, by the key
    # "common.complete", which none of its locales held: the raw key was read out
    page.evaluate("""() => { window.__announced = [];
      new MutationObserver(() => { for (const e of document.querySelectorAll('[role=status][aria-live]'))
        if (e.textContent.trim()) window.__announced.push(e.textContent.trim()); })
        .observe(document.body, {subtree: true, childList: true, characterData: true}); }""")
    _send(page, "Tell me about Trainium.")
    _wait_reply(page, bots + 1)
    _shot(page, "accessibility-after-reply")
    # the announcement that the event finished comes after "Loading content" (said while it streams)
    page.wait_for_function("() => window.__announced.some(t => t !== 'Loading content')")
    announced = page.evaluate("() => window.__announced")
    assert not any("common." in text for text in announced), announced
    assert serious(page) == [], "after a reply"
    _generate(page, "a lighthouse at dusk", "64x64", 2)
    _shot(page, "accessibility-after-image")
    assert serious(page) == [], "after an image"


def test_a_folded_bubble_still_opens_and_closes(page, tmp_path):
    """The fold arrow is disabled for assistive technology; a click on it reaches the title, and the title
    answers the keyboard (Gradio's own handling), so the reasoning shows and hides as before."""
    _wait_ready(page)
    page.locator("#chat-tab-button").click()
    conversation = {"format": "trainium-showcase-chat", "version": 1, "messages": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "Four.", "reasoning": "Two and two make four, said the reasoning."}]}
    path = tmp_path / "folded.json"
    path.write_text(json.dumps(conversation), encoding="utf-8")
    with page.expect_file_chooser() as chooser:
        page.locator("#load-json").click()
    chooser.value.set_files(str(path))
    # the loaded conversation replaces the chat (an earlier test's reply and its notice fold go)
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('What is 2 + 2?') && "
                           "document.querySelectorAll('#chatbot .message-row').length === 2")
    # the load's last step resets the context meter to its idle text: nothing re-renders the chat after it
    page.locator("#context-meter", has_text="prompt buckets").wait_for()
    title = page.locator("#chatbot .thought-group [role=button].title").first
    title.wait_for()
    thought = page.get_by_text("Two and two make four, said the reasoning.")
    assert not thought.is_visible()  # reasoning comes folded
    group = page.locator("#chatbot .thought-group").first
    folded = group.bounding_box()["height"]
    page.locator("#chatbot .thought-group [role=button].title .arrow").first.click()
    thought.wait_for(state="visible")
    # the content slides open (a Svelte transition): look once it has ended, as the eye would
    group.evaluate("g => Promise.all(g.getAnimations({subtree: true}).map(a => a.finished))")
    _shot(page, "accessibility-fold-open", full_page=False)
    assert group.bounding_box()["height"] > folded + 10  # the bubble grew by the reasoning's line
    assert title.locator("button").evaluate("b => b.disabled && b.getAttribute('aria-hidden') === 'true'")
    title.focus()
    page.keyboard.press("Enter")
    thought.wait_for(state="hidden")
    assert serious(page) == []
