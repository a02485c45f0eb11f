"""English and Arabic in headless Chromium: the locale comes from the browser's language
(or ``?lang=``), Arabic turns the page right to left, and Arabic text reads right to left in any UI language.

Reuses test_browser.py's app process (its fixtures); each test opens its own browser context with
its own locale. Screenshots: test-artifacts/screenshots/i18n-*.png.
"""

from __future__ import annotations

import pytest
from test_browser import (  # noqa: F401 - fixtures
    READY_TIMEOUT_MS,
    REPLY_TIMEOUT_MS,
    _shot,
    _wait_ready,
    app_url,
    browser,
    chromium,
)

pytestmark = pytest.mark.browser

ARABIC_TABS = ["المحادثة", "الصورة", "منصة ضمان الجودة"]
ENGLISH_TABS = ["Chat", "Image", "QA bench"]
ARABIC_WORD, LATIN_WORD = "مرحبا", "Trainium"
MIXED = f"{ARABIC_WORD} {LATIN_WORD}"  # in a right-to-left paragraph the Arabic word sits right of the Latin one

# Where the two words of MIXED are drawn inside the last visible element under ``selector`` holding them,
# and the computed unicode-bidi/direction of the text's own element.
WORD_BOXES_JS = """([selector, arabic, latin]) => {
  const holders = [...document.querySelectorAll(selector)]
    .filter((e) => e.offsetParent !== null && e.textContent.includes(arabic) && e.textContent.includes(latin));
  if (!holders.length) return null;
  const walker = document.createTreeWalker(holders[holders.length - 1], NodeFilter.SHOW_TEXT);
  let node;
  while ((node = walker.nextNode()) && !(node.textContent.includes(arabic) && node.textContent.includes(latin))) {}
  if (!node) return null;
  const box = (word) => {
    const range = document.createRange();
    const at = node.textContent.indexOf(word);
    range.setStart(node, at);
    range.setEnd(node, at + word.length);
    const r = range.getBoundingClientRect();
    return {left: r.left, top: r.top};
  };
  const style = getComputedStyle(node.parentElement);
  return {arabic: box(arabic), latin: box(latin), bidi: style.unicodeBidi, direction: style.direction};
}"""


def _open(browser, url: str, locale: str):  # noqa: F811 - the fixture
    context = browser.new_context(locale=locale, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.goto(url)
    page.locator("#status-bar").wait_for()
    page.locator("button[role=tab]").first.wait_for()
    return context, page


def _page_language(page) -> dict:
    return page.evaluate("""() => ({
      lang: document.documentElement.lang, dir: document.documentElement.dir,
      tabs: [...document.querySelectorAll('button[role=tab]')].map((b) => b.innerText.trim()),
      title: document.querySelector('#page-header h1').innerText.trim()})""")


def _tabs_read(page, tabs: list[str]) -> None:
    page.wait_for_function("(tabs) => JSON.stringify([...document.querySelectorAll('button[role=tab]')]"
                           ".map((b) => b.innerText.trim())) === JSON.stringify(tabs)", arg=tabs)


def _reads_right_to_left(boxes: dict) -> bool:
    same_line = abs(boxes["arabic"]["top"] - boxes["latin"]["top"]) < 4
    return same_line and boxes["arabic"]["left"] > boxes["latin"]["left"]


def test_an_arabic_browser_gets_arabic_labels_right_to_left(browser, app_url):  # noqa: F811
    context, page = _open(browser, app_url, "ar")
    try:
        _tabs_read(page, ARABIC_TABS)
        seen = _page_language(page)
        assert seen["lang"] == "ar" and seen["dir"] == "rtl", seen
        assert seen["title"] == "نماذج Hugging Face على AWS Trainium", seen  # the English one is hidden
        for text in ("تفاصيل الإحماء", "أخذ العينات وموجّه النظام", "تصدير JSON", "محادثة جديدة"):
            page.get_by_text(text, exact=True).first.wait_for()
        assert page.locator("#chat-tab textarea").first.get_attribute("placeholder") == "اكتب رسالة..."
        # Blocks follow the page (Gradio writes dir="ltr" on each): the label of a textbox starts on the right.
        page.locator("#export-file").wait_for(state="attached")  # rendered after the buttons on a busy machine
        assert page.evaluate("() => getComputedStyle(document.querySelector('#export-file')).direction") == "rtl"
        _shot(page, "i18n-ar-chat")
        page.get_by_role("tab", name="الصورة").click()
        page.get_by_text("توليد", exact=True).wait_for()
        label, box = page.evaluate("""() => {
          const block = document.querySelector('#image-prompt'), label = block.querySelector('[data-testid=block-info]')
            || block.querySelector('span');
          return [label.getBoundingClientRect().right, block.getBoundingClientRect().right];
        }""")
        assert box - label < 40, (label, box)  # the label is drawn at the block's right edge
        _shot(page, "i18n-ar-image")
        page.get_by_role("tab", name="منصة ضمان الجودة").click()
        page.get_by_text("تشغيل المجموعة", exact=True).wait_for()
        assert page.locator("#qa-mark").get_by_text("نجح", exact=True).count() == 1  # radio labels too
        _shot(page, "i18n-ar-qa")
    finally:
        context.close()


def test_an_english_browser_gets_english_left_to_right(browser, app_url):  # noqa: F811
    context, page = _open(browser, app_url, "en-US")
    try:
        _tabs_read(page, ENGLISH_TABS)
        seen = _page_language(page)
        assert seen["lang"] == "en" and seen["dir"] == "ltr", seen
        assert seen["title"] == "Hugging Face models on AWS Trainium", seen
        page.get_by_text("Warm-up details", exact=True).first.wait_for()
        assert page.locator("#chat-tab textarea").first.get_attribute("placeholder") == "Type a message..."
    finally:
        context.close()


@pytest.mark.parametrize(("locale", "query", "tabs", "direction"),
                         [("en-US", "?lang=ar", ARABIC_TABS, "rtl"), ("ar", "?lang=en", ENGLISH_TABS, "ltr")])
def test_the_lang_query_overrides_the_browser_language(browser, app_url, locale, query, tabs, direction):  # noqa: F811
    context, page = _open(browser, app_url + query, locale)
    try:
        _tabs_read(page, tabs)  # every tab, not only those drawn after a late switch
        seen = _page_language(page)
        assert seen["dir"] == direction and seen["lang"] == query[-2:], seen
        if direction == "rtl":
            _shot(page, "i18n-lang-query-ar")
    finally:
        context.close()


def test_arabic_text_reads_right_to_left_in_the_english_ui(browser, app_url):  # noqa: F811
    context, page = _open(browser, app_url, "en-US")
    try:
        _tabs_read(page, ENGLISH_TABS)
        _wait_ready(page)
        box = page.locator("#chat-tab textarea").first
        box.fill(MIXED)
        assert box.evaluate("(e) => getComputedStyle(e).unicodeBidi") == "plaintext"
        box.press("Enter")
        page.locator("#chatbot .message-row.user-row", has_text=ARABIC_WORD).wait_for(timeout=REPLY_TIMEOUT_MS)
        boxes = page.evaluate(WORD_BOXES_JS, ["#chatbot .message-row.user-row", ARABIC_WORD, LATIN_WORD])
        assert boxes is not None and boxes["bidi"] == "plaintext", boxes
        assert _reads_right_to_left(boxes), boxes  # left to right it would read "مرحبا" first, on the left
        assert page.evaluate("() => document.documentElement.dir") == "ltr"  # only the text turned
        _shot(page, "i18n-en-arabic-message")
        # Without ui/i18n.py's CSS the same message reads left to right: that CSS is what turns it.
        removed = page.evaluate("""() => {
          const ours = [...document.querySelectorAll('style')].filter((s) => s.textContent.includes('.i18n-ar'));
          ours.forEach((s) => s.remove());
          return ours.length;
        }""")
        plain = page.evaluate(WORD_BOXES_JS, ["#chatbot .message-row.user-row", ARABIC_WORD, LATIN_WORD])
        assert removed and not _reads_right_to_left(plain), (removed, plain)
        page.reload()
        page.locator("#status-bar").wait_for()

        # The QA grid shows an Arabic prompt right to left too.
        page.get_by_role("tab", name="QA bench").click()
        page.locator("#qa-prompts textarea").fill(MIXED)
        page.locator("#qa-variants textarea").fill("short: max_new_tokens=4, seed=1")
        page.locator("#qa-run").click()
        page.wait_for_function("() => (document.querySelector('#qa-status textarea') || {}).value"
                               "?.startsWith('Finished')", timeout=READY_TIMEOUT_MS)
        boxes = page.evaluate(WORD_BOXES_JS, ["#qa-grid td, #qa-grid [role=gridcell]", ARABIC_WORD, LATIN_WORD])
        assert boxes is not None and _reads_right_to_left(boxes), boxes
        _shot(page, "i18n-en-arabic-qa-grid")
    finally:
        context.close()
