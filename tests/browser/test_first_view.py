"""What a visitor sees of the Chat tab on a phone (390x844) and a desktop (1280x800), in pixels.

After load the page is at its top with the header, the demo notice and the warm-up bar in the viewport
(nothing focuses the message box, which would scroll a phone's page past them). After a reply its stats
line sits under it, in view, and nothing on the page moved while the reply streamed and its stats
arrived (the layout shifts the browser reports, those within 0.5 s of an input left out, as CLS does).

Runs on the session's app process (tests/browser/conftest.py); each test opens its own browser context at
its size. Screenshots of the viewport: test-artifacts/screenshots/first-view-*.png.
"""

from __future__ import annotations

import pytest
from support.browser import (
    MAX_NEW_TOKENS,
    REPLY_TIMEOUT_MS,
    WATCH_CHAT_JS,
    _bot_texts,
    _open_accordion,
    _send,
    _shot,
    _wait_ready,
    _wait_reply,
    held,
    stop_held_reply,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SIZES = {"phone": (390, 844), "desktop": (1280, 800)}
MAX_LAYOUT_SHIFT = 0.1  # Lighthouse's "good" cumulative layout shift

# Boxes of the elements named, in viewport pixels, with the scroll position and the viewport's height.
BOXES_JS = """(selectors) => ({
  scrollY: window.scrollY, height: window.innerHeight,
  boxes: Object.fromEntries(selectors.map((s) => {
    const e = document.querySelector(s);
    const r = e && e.getBoundingClientRect();
    return [s, r ? {top: r.top, bottom: r.bottom, height: r.height, width: r.width} : null];
  })),
})"""
# The last bot message's box, clipped to the chatbot's visible area (the chat scrolls inside it).
LAST_BOT_JS = """() => {
  const rows = document.querySelectorAll('#chatbot .message-row.bot-row');
  if (!rows.length) return null;
  const r = rows[rows.length - 1].getBoundingClientRect();
  return {top: r.top, bottom: r.bottom};
}"""
# Where the chat's parts sit on the page (document pixels, whatever the scroll).
PLACES_JS = """() => Object.fromEntries(['#chatbot', '#chat-stats', '#context-meter', '#chat-tab textarea'].map((s) =>
  [s, Math.round(document.querySelector(s).getBoundingClientRect().top + window.scrollY)]))"""
# Layout shifts without a recent input, summed from now on (window.__shift), and what moved.
WATCH_SHIFTS_JS = """() => {
  window.__shift = 0;
  window.__shifted = [];
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      if (entry.hadRecentInput) continue;
      window.__shift += entry.value;
      window.__shifted.push([entry.value, (entry.sources || []).map((s) => s.node && (s.node.id || s.node.className))]);
    }
  }).observe({type: 'layout-shift'});
}"""


# Every layout shift from the navigation on (an init script, so the shifts while Gradio mounts count too).
LOAD_SHIFTS_JS = """
window.__loadShift = 0;
window.__loadShifted = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    if (entry.hadRecentInput) continue;
    window.__loadShift += entry.value;
    const moved = (entry.sources || []).map((s) => s.node && (s.node.id || s.node.className));
    window.__loadShifted.push([entry.value, moved]);
  }
}).observe({type: 'layout-shift', buffered: true});
"""

def _open(browser, url: str, size: str):
    width, height = SIZES[size]
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.add_init_script(LOAD_SHIFTS_JS)
    page.goto(url)
    page.locator("#status-bar").wait_for()
    page.locator("#chat-tab textarea").first.wait_for()  # the chat's message box is drawn
    return context, page


def _in_view(box: dict, height: float) -> bool:
    return box is not None and box["height"] > 0 and box["top"] >= 0 and box["bottom"] <= height


def _view_shot(page, name: str) -> None:
    _shot(page, name, full_page=False)  # what the visitor sees: the viewport only


@pytest.mark.parametrize("size", SIZES)
def test_the_first_view_shows_the_header_the_demo_notice_and_the_warm_up_bar(browser, app_url, size):
    context, page = _open(browser, app_url, size)
    try:
        page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
        seen = page.evaluate(BOXES_JS, ["#page-header", "#demo-notice", "#warmup-bar", "#warmup-progress"])
        _view_shot(page, f"first-view-{size}")
        assert seen["scrollY"] == 0, f"the page opened scrolled down by {seen['scrollY']} px"
        for selector, box in seen["boxes"].items():
            assert _in_view(box, seen["height"]), f"{selector} is not in the viewport at {size}: {box}"
        # the progress bar itself, not squeezed to a sliver by the warm-up line beside it
        bar, width = seen["boxes"]["#warmup-progress"], SIZES[size][0]
        assert bar["width"] > width / 2, f"the progress bar is {bar['width']:.0f} px wide at {size}"
        # The message box is one click (or a few Tabs) away, not focused on load.
        assert page.evaluate("() => document.activeElement.tagName") != "TEXTAREA"
    finally:
        context.close()


# Text in Gradio's weight 600 (the title, buttons, bold) and in its regular weight.
SEMIBOLD = ("#page-header h1 .i18n-en", "#demo-notice b", "button")
REGULAR = ("#page-header .summary",)


def _fonts_drawing(page, selectors) -> dict[str, int]:
    """The fonts the browser drew these elements' text with, and how many glyphs each (Chromium's own account,
    CSS.getPlatformFontsForNode: a glyph missing from a web font shows here as its fallback font)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    drawn: dict[str, int] = {}
    for selector in selectors:
        nodes = cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": selector})["nodeIds"]
        assert nodes, f"nothing matches {selector}"
        for node in nodes:
            for font in cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]:
                drawn[font["familyName"]] = drawn.get(font["familyName"], 0) + font["glyphCount"]
    return drawn


def test_the_title_buttons_and_bold_text_draw_in_the_pages_one_font(browser, app_url):
    """Gradio's semibold web fonts hold a few glyphs ("A", "B"): every other letter of the title came from the
    system's fallback font, "AWS" with an A of another font. All of it now draws in the page's own font."""
    context, page = _open(browser, app_url, "desktop")
    try:
        _wait_ready(page)
        page.evaluate("() => document.fonts.ready.then(() => true)")
        _view_shot(page, "first-view-fonts")
        regular = _fonts_drawing(page, REGULAR)
        assert len(regular) == 1, regular
        assert _fonts_drawing(page, SEMIBOLD).keys() == regular.keys()
    finally:
        context.close()


@pytest.mark.parametrize("lang", ["en", "ar"])
@pytest.mark.parametrize("size", SIZES)
def test_the_page_holds_still_while_it_loads(browser, app_url, size, lang):
    """Gradio mounts the page piece by piece: nothing drawn may move as the rest comes in (Lighthouse's CLS,
    measured here from the navigation until the chat, the details fold and the footer are drawn)."""
    context, page = _open(browser, f"{app_url}?lang={lang}", size)
    try:
        page.locator("#chatbot").wait_for()
        page.locator("#warmup-details").wait_for()
        page.locator("footer").wait_for()
        page.wait_for_timeout(1000)  # a second of the finished page: a late shift would land here
        shift, shifted = page.evaluate("[window.__loadShift, window.__loadShifted]")
        _view_shot(page, f"first-view-{size}-{lang}-loaded")
        assert shift < MAX_LAYOUT_SHIFT, f"the page moved while loading at {size} ({lang}): {shift:.3f} ({shifted})"
    finally:
        context.close()


def test_the_first_views_fonts_come_with_the_page(browser, app_url):
    """The bold and mono faces are preloaded (a <link>), found: asked for only when text first drew in them,
    they came after the first layout on a loaded machine and re-wrapped the title and the demo notice. (The
    regular face is asked for by the first text Gradio draws, before it adds the page's head.)"""
    context, page = _open(browser, app_url, "phone")
    try:
        page.wait_for_function("() => document.fonts.status === 'loaded'")
        fonts = page.evaluate("() => performance.getEntriesByType('resource').filter((e) => e.name.endsWith('.woff2'))"
                              ".map((e) => [e.name.split('/').pop(), e.initiatorType, e.responseStatus])")
        preloaded = {name for name, initiator, status in fonts if initiator == "link" and status == 200}
        assert {"SourceSansPro-Bold.woff2", "IBMPlexMono-Regular.woff2"} <= preloaded, fonts
        assert all(status == 200 for _, _, status in fonts), fonts
    finally:
        context.close()


@pytest.mark.parametrize("size", SIZES)
def test_a_replys_stats_come_under_it_in_view_and_move_nothing(browser, app_url, size):
    context, page = _open(browser, app_url, size)
    try:
        _wait_ready(page)
        page.evaluate(WATCH_CHAT_JS)
        stats = page.locator("#chat-stats")
        _open_accordion(page, "Sampling and system prompt")
        page.get_by_label("Greedy (no sampling)").check()  # greedy runs to all MAX_NEW_TOKENS words here
        bots = len(_bot_texts(page))
        _chatting_view(page)
        # A full reply: nothing but the page itself acts from the Enter key until its stats are in.
        _send(page, "Tell me a long story about compilers.")
        page.evaluate(WATCH_SHIFTS_JS)
        page.wait_for_function("() => window.__replies.length >= 2", timeout=REPLY_TIMEOUT_MS)
        _view_shot(page, f"first-view-{size}-streaming")
        streaming = page.evaluate(PLACES_JS)
        _wait_reply(page, bots + 1)
        page.wait_for_function("() => document.querySelector('#chat-stats').innerText.includes('tokens/s')")
        page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
        _view_shot(page, f"first-view-{size}-replied")
        shift, shifted = page.evaluate("[window.__shift, window.__shifted]")
        assert shift < MAX_LAYOUT_SHIFT, f"the page moved during the reply at {size}: {shift:.3f} ({shifted})"
        # The stats line's arrival moved neither the chat, nor itself, nor the meter, nor the message box.
        assert page.evaluate(PLACES_JS) == streaming, (size, streaming)
        _assert_under_the_last_reply(page, size)

        # A stopped reply: "stopped" comes on its stats line, under it.
        bots = len(_bot_texts(page))
        page.evaluate("window.__replies = []")
        _chatting_view(page)
        with held(page.url, "chat", after_steps=12) as hold_again:  # Stop lands mid-reply, however slow the page
            _send(page, "Tell me another long story about compilers.")
            # Stop in the frame that sees the reply streaming: Playwright's click first waits for the button to
            # be stable and unobstructed (Gradio's status tracker covers it at first).
            stop_held_reply(page, lambda: page.wait_for_function(
                "() => { const b = document.querySelector('#chat-tab button.stop-button');"
                " if (window.__replies.length < 2 || !b) return false; b.click(); return true; }",
                timeout=REPLY_TIMEOUT_MS), hold_again)
        stats.filter(has_text="stopped").wait_for(timeout=REPLY_TIMEOUT_MS)
        assert len(_bot_texts(page)) == bots + 1 and len(_bot_texts(page)[-1].split()) < MAX_NEW_TOKENS
        _view_shot(page, f"first-view-{size}-stopped")
        _assert_under_the_last_reply(page, size)
    finally:
        context.close()


def _chatting_view(page) -> None:
    """The window as a person chatting has it: the message box at its bottom edge. (Clicking the greedy box
    in the open accordion scrolls the page as far as it goes, where a short page shows the box at the top.)"""
    page.locator("#chat-tab textarea").first.evaluate("e => e.scrollIntoView({block: 'end'})")


def _assert_under_the_last_reply(page, size: str) -> None:
    seen = page.evaluate(BOXES_JS, ["#chat-stats", "#chatbot"])
    stats, chatbot, last = seen["boxes"]["#chat-stats"], seen["boxes"]["#chatbot"], page.evaluate(LAST_BOT_JS)
    assert "tokens/s" in page.locator("#chat-stats").inner_text()
    assert last is not None, f"no reply at {size}"
    assert stats["top"] >= last["bottom"], f"the stats line is not under the reply at {size}: {stats} {last}"
    assert stats["top"] >= chatbot["bottom"], f"the stats line is not under the chat at {size}: {stats} {chatbot}"
    assert _in_view(stats, seen["height"]), f"the stats line is out of view at {size}: {stats}"
