"""Left-to-right runs, sliders and aria-labels on the Arabic page, as a reader sees them (headless Chromium).

A refusal that echoes a flag and a quoted value keeps them in bidi isolates and draws them left to right;
a slider near its minimum is filled from the right; Gradio's English aria-labels read Arabic. Screenshots:
test-artifacts/screenshots/bidi-*.png.
"""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image, PngImagePlugin
from support.browser import REPLY_TIMEOUT_MS, SCREENSHOTS, _open_accordion, _shot, open_page

from neuron_backend.image.png_info import JSON_KEY
from neuron_backend.messages import LRI, PDI
from ui.accessibility import GRADIO_ARIA_LABELS, GRADIO_ARIA_PREFIXES

pytestmark = pytest.mark.browser

ECHOED = 'key="a, b" --models auto'  # a PNG's size that this server refuses, echoed in the refusal

# Where the characters at ``needles`` (each the first place of that text) of the toast's text are drawn.
PLACES_JS = """([selector, needles]) => {
  const root = [...document.querySelectorAll(selector)].pop();
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node; (node = walker.nextNode());) {
    if (!needles.every((n) => node.textContent.includes(n))) continue;
    return needles.map((n) => {
      const range = document.createRange(), at = node.textContent.indexOf(n);
      range.setStart(node, at);
      range.setEnd(node, at + 1);
      const box = range.getBoundingClientRect();
      return [box.left, box.top];
    });
  }
  return null;
}"""


def test_a_refusal_keeps_a_flag_and_a_quoted_value_left_to_right(browser, app_url, tmp_path):
    png = tmp_path / "other-server.png"
    info = PngImagePlugin.PngInfo()
    info.add_text(JSON_KEY, json.dumps({"prompt": "a fox", "size": ECHOED, "steps": 4}))
    Image.new("RGB", (16, 16), "white").save(png, pnginfo=info)
    context, page = open_page(browser, app_url, "ar")
    try:
        page.locator("button[role=tab]", has_text="الصورة").click()
        page.locator("button.label-wrap", has_text="استعادة الإعدادات من ملف PNG").last.click()
        page.locator("#paste-png input[type=file]").set_input_files(str(png))
        toast = page.locator(".toast-body", has_text="مقاس الصورة").first
        toast.wait_for(timeout=REPLY_TIMEOUT_MS)
        text = toast.inner_text()
        assert f"{LRI}'{ECHOED}'{PDI}" in text, repr(text)  # the whole echoed value in one isolate
        quote, key, b, dashes, models = page.evaluate(PLACES_JS, [".toast-body", ["'key", "key", 'b"', "--m", "mod"]])
        assert quote[1] == key[1] == models[1], (quote, key, models)  # one line
        # drawn as in English: 'key="a, b" --models auto' (in a right-to-left sentence the quote and the
        # dashes went to the other end: "'key="a, b", "models auto--")
        assert quote[0] < key[0] < b[0] < dashes[0] < models[0], (quote, key, b, dashes, models)
        _shot(page, "bidi-refusal-ar", full_page=False)
    finally:
        context.close()


def _slider_ends(page, selector: str, name: str) -> tuple[tuple, tuple]:
    """The colours drawn near the left and the right end of a slider's track (a screenshot of the input)."""
    slider = page.locator(selector)
    slider.scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = Image.open(io.BytesIO(slider.screenshot(path=str(SCREENSHOTS / f"{name}.png")))).convert("RGB")
    middle = shot.height // 2
    return shot.getpixel((3, middle)), shot.getpixel((shot.width - 4, middle))


def _orange(rgb: tuple) -> bool:
    red, green, blue = rgb
    return red > 180 and blue < 120 and red - blue > 100


def _grey(rgb: tuple) -> bool:
    return max(rgb) - min(rgb) < 20 and 180 < min(rgb)


@pytest.mark.parametrize(("locale", "tab", "filled_end"), [("ar", "الصورة", "right"), ("en-US", "Image", "left")])
def test_a_slider_near_its_minimum_is_filled_from_the_minimums_side(browser, app_url, locale, tab, filled_end):
    context, page = open_page(browser, app_url, locale)
    try:
        page.locator("button[role=tab]", has_text=tab).click()
        number = page.locator("#image-steps input[type=number]")
        number.click()
        number.press("Control+A")
        number.press_sequentially("3")
        number.press("Tab")
        page.wait_for_function("() => document.querySelector('#image-steps input[type=range]').value === '3'")
        left, right = _slider_ends(page, "#image-steps input[type=range]", f"bidi-slider-{locale}")
        filled, empty = (right, left) if filled_end == "right" else (left, right)
        assert _orange(filled) and _grey(empty), (locale, left, right)
        _shot(page, f"bidi-image-tab-{locale}", full_page=False)
    finally:
        context.close()


ARIA_LABELS_JS = "() => [...document.querySelectorAll('[aria-label]')].map((e) => e.getAttribute('aria-label'))"


def _english(label: str) -> bool:
    return label in GRADIO_ARIA_LABELS or any(label.startswith(prefix) for prefix in GRADIO_ARIA_PREFIXES)


def test_no_english_aria_labels_on_the_arabic_page(browser, app_url):
    context, page = open_page(browser, app_url + "?lang=ar", "en-US")
    try:
        seen = []
        # Each tab's empty boxes ("Empty value"): a component's script loads when its tab first shows, so they
        # mount after the click; the labels are read once they are there and the page has put them in Arabic.
        # The Image tab's four: the picture, and in the opened PNG fold the file, its parameters and the code.
        # The QA bench shows its result boxes only once a run has something for them: none before a run.
        empty_boxes = {"المحادثة": (), "الصورة": ("#image-out", "#png-file", "#image-params", "#python-snippet"),
                       "منصة ضمان الجودة": ()}
        for tab, boxes in empty_boxes.items():
            page.locator("button[role=tab]", has_text=tab).click()
            if tab == "الصورة":
                _open_accordion(page, "ملف PNG والمعاملات وPython")
            for box in boxes:
                page.locator(f"{box} .empty[aria-label]").wait_for(state="attached")
            page.wait_for_function(f"() => !({ARIA_LABELS_JS})().some((l) => {json.dumps(list(GRADIO_ARIA_LABELS))}"
                                   ".includes(l))")
            seen += page.evaluate(ARIA_LABELS_JS)
        assert seen and not [label for label in seen if _english(label)], seen
        assert "اختر المثال 1: اشرح في جملتين ما هي نواة NeuronCore." in seen  # the chips speak the page's language
        assert "منزلق نطاق لـ الخطوات" in seen and "لا قيمة" in seen, seen
    finally:
        context.close()
    context, page = open_page(browser, app_url + "?lang=en", "ar")
    try:  # an English page keeps Gradio's English
        page.locator("button[role=tab]", has_text="Image").click()
        page.wait_for_function(f"() => ({ARIA_LABELS_JS})().includes('range slider for Steps')")
        assert not any(label.startswith(("اختر", "منزلق")) for label in page.evaluate(ARIA_LABELS_JS))
    finally:
        context.close()
