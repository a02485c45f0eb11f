"""Chat text that Markdown would make live stays text in the page: a tag right after a bare URL, Markdown
images, a LaTeX block holding a tag. Sent from a conversation file (Load JSON) as user, reply and reasoning
text, so no generation is needed; what Gradio's own renderer made of it is read from #chatbot.

Runs on the session's app process (tests/browser/conftest.py).
"""

from __future__ import annotations

import json

import pytest
from support.browser import _wait_ready

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOWHERE = "http://127.0.0.1:9"  # nothing listens there: a fetch would only show in the request log
LIVE_TEXTS = [f"see {NOWHERE}/<img src={NOWHERE}/a.png id=after-url> end",
              f'{NOWHERE}/x<div style="position:fixed;inset:0;background:red" id=cover>covered</div>',
              f"www.example.com/<img src={NOWHERE}/b.png id=after-www>",
              f"![remote]({NOWHERE}/c.png) and ![ref][r]\n\n[r]: {NOWHERE}/d.png",
              f"$$<img src={NOWHERE}/e.png id=in-latex>$$"]


def test_urls_images_and_latex_in_chat_text_make_nothing_live(page, tmp_path):
    _wait_ready(page)
    page.locator("#chat-tab-button").click()
    fetched = []
    page.on("request", lambda request: fetched.append(request.url) if request.url.startswith(NOWHERE) else None)
    messages = []
    for text in LIVE_TEXTS:
        messages += [{"role": "user", "content": text},
                     {"role": "assistant", "content": f"reply {text}", "reasoning": f"thought {text}"}]
    path = tmp_path / "live.json"
    path.write_text(json.dumps({"format": "trainium-showcase-chat", "version": 1, "messages": messages}),
                    encoding="utf-8")
    with page.expect_file_chooser() as chooser:
        page.locator("#load-json").click()
    chooser.value.set_files(str(path))
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('reply see')")
    assert _live(page) == []  # before an overlay could take the clicks below
    # Unfold the reasoning bubbles: their text is rendered too. Each unfolding grows the chat, which then
    # scrolls, so a click can land beside the title it aimed at: click the folded ones until none is left.
    page.locator("#chatbot .thought-group").nth(len(LIVE_TEXTS) - 1).wait_for()
    folded = page.locator("#chatbot .thought-group [role=button].title:not(.expanded)")
    for _ in range(3 * len(LIVE_TEXTS)):
        if not folded.count():
            break
        folded.first.click()
    assert folded.count() == 0, "a reasoning bubble stayed folded"
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('thought see')")
    assert _live(page) == []
    assert fetched == [], fetched
    user = page.locator("#chatbot .message-row.user-row").first.inner_text()
    assert f"{NOWHERE}/<img src={NOWHERE}/a.png id=after-url>" in user, user  # shown as typed


def _live(page) -> list[str]:
    """Images and elements the text made (KaTeX styles its own spans: a $$ block is LaTeX by design)."""
    return page.locator("#chatbot img, #chatbot #cover, #chatbot [id^=after-], #chatbot #in-latex, "
                        "#chatbot .md [style]").evaluate_all(
        "els => els.filter(e => !e.closest('.katex')).map(e => e.outerHTML.slice(0, 200))")
