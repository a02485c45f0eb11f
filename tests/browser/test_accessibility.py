"""axe-core finds nothing critical or serious on any tab, in English and in Arabic, before and after a
reply and an image; the fold of a reply's bubble still opens and closes by mouse and keyboard after the
page's accessibility repairs (ui/accessibility.py).

axe-core comes from npm, pinned in the repository's package.json and package-lock.json (``npm ci`` installs it
into node_modules/, as .ci/run does); its axe.min.js is injected into the page and runs there. Every finding of
every impact is written to test-artifacts/axe/ per page state. Runs on the session's app process
(tests/browser/conftest.py).
"""

from __future__ import annotations

import json
import os
import re

import pytest
from support.browser import (
    ARTIFACTS,
    READY_TIMEOUT_MS,
    REPLY_TIMEOUT_MS,
    ROOT,
    WATCH_CHAT_JS,
    _generate,
    _send,
    _short_replies,
    _shot,
    _wait_ready,
    _wait_reply,
    open_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TABS = ("#chat-tab-button", "#image-tab-button", "#qa-tab-button")
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
AXE_VERSION = json.loads((ROOT / "package.json").read_text())["devDependencies"]["axe-core"]


def axe_source() -> str:
    """axe.min.js of the pinned axe-core; skip (fail in CI) when ``npm ci`` has not installed it."""
    if not AXE.exists():
        reason = f"axe-core is not installed at {AXE} (run npm ci in the repository root)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(reason)
        pytest.skip(reason)
    return AXE.read_text(encoding="utf-8")


def violations(page, state: str) -> list[dict]:
    """axe-core's findings on the page as it is now (each rule once: id, impact, first targets), also written to
    test-artifacts/axe/<state>.json."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(content=axe_source())
    assert page.evaluate("() => axe.version") == AXE_VERSION
    found = page.evaluate("() => axe.run(document, {resultTypes: ['violations']}).then(r => r.violations)")
    shown = [{"id": v["id"], "impact": v["impact"], "targets": [n["target"] for n in v["nodes"][:3]]} for v in found]
    folder = ARTIFACTS / "axe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{re.sub(r'[^a-z0-9-]+', '-', state.lower())}.json").write_text(
        json.dumps({"axe": AXE_VERSION, "violations": shown}, indent=1))
    return shown


def serious(page, state: str) -> list[dict]:
    """The critical and serious findings, and the image-redundant-alt ones (minor: a screen reader reads the
    same words twice)."""
    return [v for v in violations(page, state)
            if v["impact"] in ("critical", "serious") or v["id"] == "image-redundant-alt"]


# Every engine chip says ready (either language: its data-state is the engine's state word in English).
ENGINES_READY_JS = """() => { const chips = [...document.querySelectorAll('#engine-chips .chip')];
  return chips.length > 0 && chips.every(c => c.dataset.state === 'ready'); }"""


def _check_tabs(page, locale: str, form: str, moment: str) -> None:
    for tab in TABS:
        page.locator(tab).click()
        page.wait_for_timeout(300)  # the tab's components render
        assert serious(page, f"{tab[1:-11]}-{locale}-{form}-{moment}") == [], (locale, form, tab, moment)


def _results(page) -> None:
    """A reply, an image and a QA run, made through the page in either language (by element ids)."""
    page.locator("#chat-tab-button").click()
    page.evaluate(WATCH_CHAT_JS)
    _send(page, "Tell me about Trainium.")
    _wait_reply(page, 1)
    page.locator("#image-tab-button").click()
    page.locator("#image-prompt textarea").fill("a lighthouse at dusk")
    steps = page.locator("#image-steps input[type=number]")
    steps.fill("2")
    steps.press("Tab")
    page.locator("#generate").click()
    page.locator("#gallery .thumbnail-item img").first.wait_for(timeout=REPLY_TIMEOUT_MS)
    page.locator("#qa-tab-button").click()
    page.locator("#qa-kind input[value=both]").check()
    page.locator("#qa-prompts textarea").fill("Name a colour.")
    page.locator("#qa-variants textarea").fill("v: max_new_tokens=4, seed=1, size=64x64, steps=1")
    page.locator("#qa-run").click()
    page.locator("#qa-gallery .thumbnail-item img").first.wait_for(timeout=REPLY_TIMEOUT_MS)
    page.locator("#qa-stop").wait_for(state="hidden")


@pytest.mark.parametrize("form", ["desktop", "phone"])
@pytest.mark.parametrize("locale", ["en-US", "ar"])
def test_axe_finds_nothing_serious_on_any_tab_before_and_after_results(browser, app_url, locale, form):
    context, page = open_page(browser, app_url, locale, phone=form == "phone")
    try:
        page.wait_for_function(ENGINES_READY_JS, timeout=READY_TIMEOUT_MS)
        _check_tabs(page, locale, form, "before")
        # Lighthouse's image-redundant-alt (minor to axe): no footer icon repeats its button's words.
        assert page.locator('footer button > img:not([alt=""])').count() == 0
        _results(page)
        _shot(page, f"accessibility-{locale}-{form}-after", full_page=False)
        _check_tabs(page, locale, form, "after")
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
    assert serious(page, "chat-after-reply") == [], "after a reply"
    _generate(page, "a lighthouse at dusk", "64x64", 2)
    _shot(page, "accessibility-after-image")
    assert serious(page, "image-after-image") == [], "after an image"


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
    assert serious(page, "chat-fold") == []
