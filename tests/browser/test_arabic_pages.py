"""English and Arabic in headless Chromium: the locale comes from the browser's language
(or ``?lang=``), Arabic turns the page right to left, and Arabic text reads right to left in any UI language.

Runs on the session's app process (tests/browser/conftest.py); each test opens its own browser context
with its own locale. One test per tab reads that tab in Arabic. Screenshots: test-artifacts/screenshots/i18n-*.png.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from support.browser import (
    READY_TIMEOUT_MS,
    RECORD_PROGRESS_JS,
    REPLY_TIMEOUT_MS,
    TABLE_ROWS_JS,
    _open_accordion,
    _shot,
    _wait_image_sizes_ready,
    _wait_ready,
    open_page,
)
from support.i18n_check import english_phrases, has_arabic

from tools.qa import grid as qa_grid

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




def _page_language(page) -> dict:
    return page.evaluate("""() => ({
      lang: document.documentElement.lang, dir: document.documentElement.dir,
      tabs: [...document.querySelectorAll('button[role=tab]')].map((b) => b.innerText.trim()),
      // the title the eye sees: until its first refresh the header holds one copy per language, CSS showing one
      title: [...document.querySelectorAll('h1')].filter((e) => e.checkVisibility()).map((e) => e.innerText.trim())
        .join(' | ')})""")


def _tabs_read(page, tabs: list[str]) -> None:
    page.wait_for_function("(tabs) => JSON.stringify([...document.querySelectorAll('button[role=tab]')]"
                           ".map((b) => b.innerText.trim())) === JSON.stringify(tabs)", arg=tabs)


def _reads_right_to_left(boxes: dict) -> bool:
    same_line = abs(boxes["arabic"]["top"] - boxes["latin"]["top"]) < 4
    return same_line and boxes["arabic"]["left"] > boxes["latin"]["left"]


def test_an_arabic_browser_gets_arabic_labels_right_to_left(browser, app_url):  # noqa: F811
    context, page = open_page(browser, app_url, "ar")
    try:
        _tabs_read(page, ARABIC_TABS)
        seen = _page_language(page)
        assert seen["lang"] == "ar" and seen["dir"] == "rtl", seen
        assert seen["title"] == "نماذج Hugging Face على AWS Trainium", seen  # the English one is hidden
        for text in ("تفاصيل الإحماء", "أخذ العينات وموجّه النظام", "تصدير JSON", "محادثة جديدة"):
            page.get_by_text(text, exact=True).first.wait_for()
        assert page.locator("#chat-tab textarea").first.get_attribute("placeholder") == "اكتب رسالة..."
        # Blocks follow the page (Gradio writes dir="ltr" on each): the label of a textbox starts on the right.
        page.locator("#chatbot").wait_for(state="attached")
        assert page.evaluate("() => getComputedStyle(document.querySelector('#chatbot')).direction") == "rtl"
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
    context, page = open_page(browser, app_url, "en-US")
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
    context, page = open_page(browser, app_url + query, locale)
    try:
        _tabs_read(page, tabs)  # every tab, not only those drawn after a late switch
        seen = _page_language(page)
        assert seen["dir"] == direction and seen["lang"] == query[-2:], seen
        if direction == "rtl":
            _shot(page, "i18n-lang-query-ar")
    finally:
        context.close()


def test_arabic_text_reads_right_to_left_in_the_english_ui(browser, app_url):  # noqa: F811
    context, page = open_page(browser, app_url, "en-US")
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
          const ours = [...document.querySelectorAll('style')]
            .filter((s) => s.textContent.includes('.block[dir="ltr"]'));
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


# English words that stay Latin beside Arabic, per tab: the model's maker, a tool's name, product names.
CHAT_WORDS = ("Qwen",)
IMAGE_WORDS = ("A1111",)
STATUS_WORDS = ("Hugging Face", "AWS Trainium", "FLUX.2-klein", "Qwen3", "TorchNeuron", "torch.compile")


def _arabic(text: str, allowed: tuple[str, ...] = ()) -> str:
    """``text`` has Arabic and no English phrase but ``allowed`` (a bilingual title's hidden English left out)."""
    text = re.sub(r'<span class="i18n-en">[^<]*</span>', "", text)  # both languages' title: CSS hides this one
    assert has_arabic(text), text
    assert english_phrases(text, allowed) == [], (english_phrases(text, allowed), text)
    return text


def _arabic_chat(text: str) -> str:
    return _arabic(text, CHAT_WORDS)


def _arabic_image(text: str) -> str:
    return _arabic(text, IMAGE_WORDS)


def _arabic_status(text: str, allowed: tuple[str, ...] = ()) -> str:
    return _arabic(text, STATUS_WORDS + allowed)


def _arabic_qa(text: str, allowed: tuple[str, ...] = ()) -> str:
    return _arabic(text, allowed)


# ----- in the browser --------------------------------------------------------------------------------
@pytest.mark.browser
def test_an_arabic_page_chats_in_arabic(browser, app_url):
    """Send a message to the demo chat model from a page in Arabic: stats, meter and a refusal are Arabic."""
    english, ready = open_page(browser, app_url, "en-US")  # warm-up finished (its "done" text, in English)
    _wait_ready(ready)
    english.close()
    context, page = open_page(browser, app_url, "ar")
    try:
        meter = page.locator("#context-meter")
        _arabic_chat(meter.inner_text())  # before any reply: the Arabic half of the page-built text shows
        box = page.locator("#chat-tab textarea").first
        box.fill("مرحبا")
        box.press("Enter")
        stats = page.locator("#chat-stats")
        page.wait_for_function("() => document.querySelector('#chat-stats').innerText.includes('ث')",
                               timeout=REPLY_TIMEOUT_MS)
        _arabic_chat(stats.inner_text())
        page.wait_for_function("() => document.querySelector('#context-meter').innerText.includes('/')")
        assert "/" in _arabic_chat(meter.inner_text())
        page.wait_for_function("() => !document.querySelector('#chat-tab textarea').disabled")
        box.fill("x" * 20_001)  # over --max-prompt-chars (20000)
        box.press("Enter")
        note = page.locator("#chatbot .message-row.bot-row", has_text="بلا إجابة").last
        note.wait_for(timeout=REPLY_TIMEOUT_MS)
        note.get_by_text("بلا إجابة").click()  # the note is folded: open it, as a reader would
        detail = note.get_by_text("20001")
        detail.wait_for()
        assert detail.is_visible()
        _arabic_chat(note.inner_text())
        toast = page.get_by_test_id("toast-body").filter(has_text="20000").first
        toast.wait_for()
        # its header is Gradio's own, drawn by the frontend from the toast's type ("Warning"); the rest is Arabic
        _arabic_chat(toast.inner_text().replace("Warning", ""))
        _shot(page, "i18n-chat-ar")
    finally:
        context.close()


@pytest.mark.browser
def test_the_image_tab_in_arabic_shows_arabic_progress_captions_and_toasts(browser, app_url, tmp_path):

    context, page = open_page(browser, app_url, "ar")
    try:
        _wait_image_sizes_ready(page, app_url)
        page.get_by_text("توليد", exact=True).wait_for()
        page.evaluate(RECORD_PROGRESS_JS)
        page.evaluate(RECORD_LABELS_JS)
        # A refusal first: an empty prompt.
        page.locator("#generate").click()
        toast = page.locator(".toast-body", has_text="الموجّه فارغ").first
        toast.wait_for(timeout=REPLY_TIMEOUT_MS)
        _arabic_image(toast.inner_text())
        # Its title: Gradio writes "Warning"; the CSS hides the word and shows the table's Arabic one.
        title = toast.locator(".toast-title")
        assert title.evaluate("e => getComputedStyle(e, '::before').content") == '"تنبيه"'
        assert title.evaluate("e => getComputedStyle(e).fontSize") == "0px"
        # One small image (the smallest size, the default); enough steps (~1-4 s) for progress and previews to show.
        page.locator("#image-prompt textarea").fill("a red fox in the snow")
        steps = page.locator("#image-steps input[type=number]")
        steps.click()
        steps.press("Control+A")
        steps.press_sequentially("50")
        steps.press("Tab")
        page.locator("#generate").click()
        page.locator("#gallery .thumbnail-item").first.wait_for(timeout=REPLY_TIMEOUT_MS)
        progress = page.evaluate("window.__progress")
        steps_seen = [p for p in progress if "الخطوة" in p]
        assert steps_seen, progress
        for text in progress:
            _arabic_image(text)
        previews = [t for t in page.evaluate("window.__imageLabels") if t.startswith("معاينة")]
        assert previews and all(re.match(r"معاينة · الصورة 1 · الخطوة \d+/50", t) for t in previews), previews
        # The PNG's file name reads left to right in one piece: its stem left of its ".png".
        _open_accordion(page, "ملف PNG والمعاملات وPython")  # the files, folded under the picture
        stem, ext = (page.locator(f"#png-file td.filename .{part}").first.bounding_box() for part in ("stem", "ext"))
        assert stem["x"] + stem["width"] <= ext["x"] + 1, (stem, ext)
        # and the notice's "--models full" never breaks after a hyphen
        page.wait_for_function("() => { const e = document.querySelector('#demo-notice code');"  # live: redrawn
                               " return e !== null && getComputedStyle(e).whiteSpace === 'nowrap'; }")
        captions = page.locator("#gallery .caption-label").all_inner_texts()  # the thumbnails' names
        assert captions and all(re.fullmatch(r"البذرة \d+ · 64x64", c) for c in captions), captions
        # A dropped file that is not a PNG is refused, in Arabic.
        page.locator("button.label-wrap", has_text="استعادة الإعدادات من ملف PNG").last.click()
        fake = tmp_path / "not-really.png"
        fake.write_text("plain text, not an image")
        page.locator("#paste-png input[type=file]").set_input_files(str(fake))
        refused = page.locator(".toast-body", has_text="هذا الملف ليس PNG").first
        refused.wait_for(timeout=REPLY_TIMEOUT_MS)
        _arabic_image(refused.inner_text())
        page.locator("#gallery .caption-label").first.scroll_into_view_if_needed()
        _shot(page, "i18n-image-ar")
    finally:
        context.close()


# The labels #image-out has shown (the preview's label while it runs), in order.
RECORD_LABELS_JS = """() => {
  window.__imageLabels = [];
  new MutationObserver(() => {
    const label = document.querySelector('#image-out [data-testid=block-label]');
    const text = label ? label.textContent.trim() : '';
    if (text && window.__imageLabels[window.__imageLabels.length - 1] !== text) window.__imageLabels.push(text);
  }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


# ----- the page in Arabic ------------------------------------------------------------------------------
@pytest.mark.browser
def test_the_status_panel_in_an_arabic_browser(browser, app_url):
    context = browser.new_context(locale="ar", viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(30_000)
    page = context.new_page()
    try:
        page.goto(app_url)
        page.locator("#warmup-state", has_text="اكتمل الإحماء").wait_for(timeout=READY_TIMEOUT_MS)
        # the tab title stays a plain string: Gradio 6.31 writes gr.Blocks(title=gr.I18n data) raw ("__i18n__{...}")
        assert page.title() == "Hugging Face on Trainium"
        chips = page.locator("#engine-chips").inner_text()
        assert "المحادثة · Qwen3 تجريبي (مصغّر) · cpu · جاهز" in chips, chips
        header = page.locator("#page-header").inner_text()
        _arabic_status(header)
        _open_accordion(page, "تفاصيل الإحماء")
        page.locator("#warmup-details-text", has_text="يعمل على").wait_for()
        page.wait_for_function("() => document.querySelector('#warmup-table').innerText.includes('المهمة')")
        headers = page.locator("#warmup-table thead").inner_text()
        assert "المهمة" in headers and "ذاكرة الترجمة" in headers and "task" not in headers, headers
        page.wait_for_function(f"() => ({TABLE_ROWS_JS})().length > 0")  # rows come a moment after the headers
        rows = page.evaluate(TABLE_ROWS_JS)
        assert rows and rows[0][0] == "المحادثة · جلب الأوزان", rows
        assert all("جاهز" in row[2] for row in rows), rows
        _arabic_status(" ".join(" ".join(row[:3]) for row in rows))
        _arabic_status(page.locator("#warmup-details-text").inner_text().split("**")[0])
        _table_fits(page)
        # "(--models tiny)" in one piece: the dashes drawn left of "models", as in English (jumbled before)
        for where in ("#demo-notice", "#warmup-details-text"):
            dashes, word = page.evaluate(FLAG_PLACES_JS, where)
            assert dashes < word, (where, dashes, word)
        _shot(page, "i18n-status-ar")
    finally:
        context.close()
    context = browser.new_context(locale="en", viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    try:
        page.goto(app_url)
        page.locator("#warmup-state", has_text="Warm-up done").wait_for(timeout=READY_TIMEOUT_MS)
        _open_accordion(page, "Warm-up details")
        page.wait_for_function("() => document.querySelector('#warmup-table').innerText.includes('compile cache')")
        _table_fits(page)
        _shot(page, "i18n-status-en")
    finally:
        context.close()


# The header cells' box, and where "--" and "models" of the first "--models" under a selector are drawn.
HEADER_BOXES_JS = """() => [...document.querySelectorAll('#warmup-table thead th')].map(th => {
  const r = th.getBoundingClientRect(); return [th.innerText.trim(), r.left, r.right, r.height]; })"""
FLAG_PLACES_JS = """(selector) => {
  const walker = document.createTreeWalker(document.querySelector(selector), NodeFilter.SHOW_TEXT);
  for (let node; (node = walker.nextNode());) {
    const at = node.textContent.indexOf('--models');
    if (at < 0) continue;
    const left = k => { const range = document.createRange(); range.setStart(node, k); range.setEnd(node, k + 1);
                        return range.getBoundingClientRect().left; };
    return [left(at), left(at + 2)];
  }
  return null;
}"""


def _table_fits(page) -> None:
    """The task table's six columns in view at 1280 px, its header one line (was ~270 px: "compile cache" one
    letter a line in a 32 px column, three columns behind a side scroll)."""
    cells = page.evaluate(HEADER_BOXES_JS)
    width = page.evaluate("() => document.documentElement.clientWidth")
    assert len(cells) == 6, cells
    assert all(0 <= left and right <= width for _, left, right, _ in cells), (width, cells)
    assert all(height < 60 for *_, height in cells), cells


# ----- the page in Arabic (headless Chromium) ----------------------------------------------------------------------
QA_MARK_STATE_JS = """() => ({
  toasts: [...document.querySelectorAll('.toast-body')].map((e) => e.innerText),
  cell: document.querySelector('#qa-cell input').value,
  mark: (document.querySelector('#qa-mark input:checked') || {}).value,
  status: document.querySelector('#qa-status textarea').value,
  cells: [...document.querySelectorAll('#qa-grid td')].map((e) => e.textContent.trim().slice(0, 60)),
})"""


@pytest.mark.browser
def test_the_qa_bench_in_arabic(browser, app_url):

    warm, page = open_page(browser, app_url, "en-US")
    try:
        _wait_ready(page)  # its text is the status helper's; the Arabic page below runs on a warm app
    finally:
        warm.close()
    context, page = open_page(browser, app_url, "ar")
    try:
        page.get_by_role("tab", name="منصة ضمان الجودة").click()
        # A tab's components mount after its first click: wait for the label before counting it.
        engine_label = page.locator("#qa-kind").get_by_text("محادثة", exact=True)
        engine_label.first.wait_for()
        assert engine_label.count() == 1  # the engine's label
        # The speed table opened before any run: its headers in Arabic too (written when the box opens).
        page.locator("#qa-speed-box button.label-wrap").first.click()
        arabic_header = qa_grid.speed_headers("ar")[1]
        page.locator("#qa-speed th", has_text=arabic_header).first.wait_for(timeout=REPLY_TIMEOUT_MS)
        speed_heads = page.locator("#qa-speed th").evaluate_all("ths => ths.map(t => t.textContent)")
        assert not any(h in " ".join(speed_heads) for h in qa_grid.speed_headers("en")[1:]), speed_heads
        page.locator("#qa-speed-box button.label-wrap").first.click()
        page.locator("#qa-prompts textarea").fill("Say hello.\nName a colour.")
        page.locator("#qa-variants textarea").fill("cold: temperature=9")
        page.locator("#qa-run").click()
        toast = page.locator(".toast-body").first
        toast.wait_for(timeout=REPLY_TIMEOUT_MS)
        _arabic_qa(toast.inner_text())
        assert "temperature" in toast.inner_text()  # the setting's name stays as typed
        page.evaluate("document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click())")
        page.locator("#qa-variants textarea").fill("cold: max_new_tokens=6, temperature=0.3, seed=1\n"
                                                   "hot: max_new_tokens=6, temperature=1.5, seed=1")
        page.locator("#qa-run").click()
        page.wait_for_function("() => (document.querySelector('#qa-status textarea') || {}).value"
                               "?.startsWith('انتهى')", timeout=READY_TIMEOUT_MS)
        status = page.locator("#qa-status textarea").input_value()
        assert status.startswith("انتهى: اكتملت 4/4 خلية · cold: "), status
        _arabic_qa(status)
        seen = page.evaluate("""() => {
          const texts = (sel) => [...document.querySelectorAll(sel)].filter((e) => e.offsetParent !== null)
            .map((e) => e.textContent.replace('⋮', '').trim());  // a column's menu button
          return {grid: texts('#qa-grid th'), summary: texts('#qa-summary th'),
                  cells: texts('#qa-grid td'), rows: texts('#qa-summary td')};
        }""")
        assert "الموجّه" in seen["grid"] and {"cold", "hot"} <= set(seen["grid"]), seen
        summary = [h for h in seen["summary"] if h]
        assert summary and all(has_arabic(h) for h in summary), seen
        verdicts = [c for c in seen["cells"] if "البذرة" in c]
        assert len(verdicts) >= 2, seen["cells"]  # the drawn result cells: the model's text, "[البذرة 1 · … رمز/ث]"
        # a reviewer's mark: the verdict in the cell reads Arabic ("✅ نجح"), and the status line counts it
        page.locator("#qa-cell input").fill("1")
        page.locator("#qa-mark").get_by_text("نجح", exact=True).click()
        page.locator("#qa-save-mark").click()
        try:
            page.wait_for_function("() => [...document.querySelectorAll('#qa-grid td')]"
                                   ".some((td) => td.textContent.includes('✅ نجح'))", timeout=REPLY_TIMEOUT_MS)
        except PlaywrightTimeout:  # what the page showed instead: a refusal, another mark, another cell
            pytest.fail(f"no mark in the grid: {page.evaluate(QA_MARK_STATE_JS)}")
        page.wait_for_function("() => document.querySelector('#qa-status textarea').value.includes('نجحت 1')")
        _arabic_qa(page.locator("#qa-status textarea").input_value())
        _shot(page, "i18n-qa-ar")
    finally:
        context.close()
