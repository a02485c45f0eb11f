"""The QA bench in headless Chromium: a readable grid at 1280 px and a blind A/B review.

Runs on the session's app process (tests/browser/conftest.py); screenshots go to
test-artifacts/screenshots/qa-*.png.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.browser import (
    BAR_BLINKS_JS,
    BARS_OVER_JS,
    REPLY_TIMEOUT_MS,
    SEEN_JS,
    _open_accordion,
    _shot,
    _wait_ready,
    held,
    open_page,
)

pytestmark = pytest.mark.browser

PROMPTS = ["Write a haiku about <b>bold</b> weather and the sea at dawn, please", "Name a colour.",
           "Count to three."]
VARIANTS = "cold: max_new_tokens=24, temperature=0.3, seed=1\nhot: max_new_tokens=24, temperature=1.5, seed=1"


def _value(pg, selector: str) -> str:
    return pg.evaluate(f"() => document.querySelector('{selector} textarea').value")


def _wait_value(pg, selector: str, prefix: str) -> None:
    pg.wait_for_function(f"(p) => (document.querySelector('{selector} textarea') || {{}}).value?.startsWith(p)",
                           arg=prefix, timeout=REPLY_TIMEOUT_MS)


# The sections the eye sees on the tab: each id of ``ids`` whose element is on the page with a size, not hidden.
SEEN_SECTIONS_JS = f"""(ids) => ids.filter(id => {{
  const e = document.querySelector(id);
  if (!e || !({SEEN_JS})(e)) return false;
  const r = e.getBoundingClientRect();
  return r.width > 0 && r.height > 0;
}})"""
SECTIONS = ("#qa-stop", "#qa-gallery", "#qa-export-file", "#qa-compare-box", "#qa-compare-grid", "#qa-diff",
            "#qa-diff-gallery", "#qa-status", "#qa-summary", "#qa-grid")
# A label the eye reads whole: its text is not cut off by its box (text-overflow: ellipsis).
LABEL_WHOLE_JS = """(id) => { const l = document.querySelector(id + ' [data-testid=block-label]');
  return l !== null && l.scrollWidth <= l.clientWidth + 1; }"""


def test_qa_sections_show_when_they_have_something_and_stop_while_a_set_runs(browser, app_url):
    context, page = open_page(browser, app_url, "en-US")
    try:
        _wait_ready(page)
        page.get_by_role("tab", name="QA bench").click()
        page.locator("#qa-run").wait_for()
        # Before a run: the form, the status and the two tables; no empty gallery, export box, compare view, Stop.
        assert page.evaluate(SEEN_SECTIONS_JS, list(SECTIONS)) == ["#qa-status", "#qa-summary", "#qa-grid"]
        assert page.evaluate(LABEL_WHOLE_JS, "#qa-upload"), "the upload label is cut off"
        _shot(page, "qa-sections-before-run")
        page.locator("#qa-kind").get_by_text("chat", exact=True).click()
        page.locator("#qa-prompts textarea").fill("Name a colour.")
        page.locator("#qa-variants textarea").fill("short: max_new_tokens=4, seed=1")
        with held(app_url, "chat", after_steps=2):  # the cell waits mid-reply while the page is read
            page.locator("#qa-run").click()
            _wait_value(page, "#qa-status", "0/1 cells done")
            assert "#qa-stop" in page.evaluate(SEEN_SECTIONS_JS, list(SECTIONS))  # Stop, while the set runs
            _shot(page, "qa-sections-mid-run", full_page=False)
        _wait_value(page, "#qa-status", "Finished: 1/1 cells done")
        page.wait_for_function(f"() => !({SEEN_SECTIONS_JS})(['#qa-stop']).length")
        # A chat-only set: no image gallery after it either.
        assert page.evaluate(SEEN_SECTIONS_JS, list(SECTIONS)) == ["#qa-status", "#qa-summary", "#qa-grid"]
        _shot(page, "qa-sections-after-run")
        page.locator("#qa-export-csv").click()
        page.locator("#qa-export-file a.download-link").wait_for()
        page.locator("#qa-compare").click()
        page.locator("#qa-compare-grid").get_by_text("What changed (0 of 1 cells changed)").first.wait_for(
            timeout=REPLY_TIMEOUT_MS)
        page.wait_for_function(f"() => !({SEEN_SECTIONS_JS})(['#qa-stop']).length")
        # Nothing changed (fixed seeds): the compare table, and no empty diff box or image pairs.
        assert page.evaluate(SEEN_SECTIONS_JS, list(SECTIONS)) == [
            "#qa-export-file", "#qa-compare-box", "#qa-compare-grid", "#qa-status", "#qa-summary", "#qa-grid"]
        _shot(page, "qa-sections-after-compare")
    finally:
        context.close()


def test_qa_grid_fits_1280_and_blind_ab_hides_the_names(page, app_url):  # noqa: F811 - the fixture
    _wait_ready(page)
    page.get_by_role("tab", name="QA bench").click()
    page.locator("#qa-prompts textarea").fill("\n".join(PROMPTS))
    page.locator("#qa-variants textarea").fill(VARIANTS)
    with held(app_url, "chat", after_steps=3):  # the first cell waits mid-reply while the page is read
        page.locator("#qa-run").click()
        _wait_value(page, "#qa-status", "0/6 cells done")
        # The progress bar stays on while a cell runs (it went out at each cell's row, until the next one).
        blinks = page.evaluate(BAR_BLINKS_JS, [1500, "#qa-status textarea"])
        assert not blinks, f"no progress bar while the first cell ran, at {blinks} ms"
        # One bar, over the status line (it was drawn over each of the run's seven boxes).
        assert page.evaluate(BARS_OVER_JS) == ["qa-status"]
        _shot(page, "qa-mid-run")
    _wait_value(page, "#qa-status", "Finished: 6/6 cells done")
    # At 1280 px both variants sit beside the prompt, no sideways scrolling, text wrapped.
    box = page.evaluate("""() => {
      const grid = document.querySelector('#qa-grid');
      const cells = [...grid.querySelectorAll('table th')].filter(th => th.offsetParent !== null);
      const r = grid.getBoundingClientRect();
      return {gridRight: r.right, gridWidth: r.width, widths: cells.map(c => c.getBoundingClientRect().width),
              rights: cells.map(c => c.getBoundingClientRect().right), scroll: document.documentElement.scrollWidth};
    }""")
    assert box["scroll"] <= 1280 and len(box["rights"]) >= 4, box
    assert max(box["rights"]) <= box["gridRight"] + 1, box  # the last variant column is on screen
    assert box["widths"][1] >= 150, box  # the prompt column is readable
    _shot(page, "qa-grid-1280")

    _open_accordion(page, "Blind A/B")
    page.locator("#qa-ab-start").click()
    _wait_value(page, "#qa-ab-heading", "Pair 1 of 3")
    seen = []
    for choice in ("left", "tie", "right"):
        heading = _value(page, "#qa-ab-heading")
        left, right, result = _value(page, "#qa-ab-left"), _value(page, "#qa-ab-right"), _value(page, "#qa-ab-result")
        for text in (heading, left, right, result):
            assert "cold" not in text and "hot" not in text, text  # no name before the end
        assert "seed" not in left + right
        seen.append(heading)
        if choice == "left":
            _shot(page, "qa-ab-blind")
        page.locator(f"#qa-ab-pick-{choice}").click()
        if choice != "right":
            _wait_value(page, "#qa-ab-heading", f"Pair {len(seen) + 1} of 3")
    assert "&lt;b&gt;" not in seen[0] and "<b>bold</b>" in seen[0]  # the prompt shows as typed
    _wait_value(page, "#qa-ab-heading", "Done: 3 of 3 pairs picked")
    result = _value(page, "#qa-ab-result")
    assert result.startswith("cold vs hot: ") and "tie 1 · unpicked 0" in result
    lines = result.splitlines()[1:]
    assert [line.split(" -> ")[1].split(" ")[0] for line in lines] == ["left", "tie", "right"]
    winners = [line.rsplit("(", 1)[1].rstrip(")") for line in lines]
    assert winners[1] == "tie" and {winners[0], winners[2]} <= {"cold", "hot"}
    _shot(page, "qa-ab-revealed")

    page.locator("#qa-export-jsonl").click()
    page.wait_for_function("() => (document.querySelector('#qa-export-file a.download-link') || {}).download"
                           "?.endsWith('.jsonl')")
    with page.expect_download() as download:
        page.locator("#qa-export-file a.download-link").click()
    head = json.loads(Path(download.value.path()).read_text(encoding="utf-8").splitlines()[0])
    picks = [p[p["pick"]] if p["pick"] != "tie" else "tie" for p in head["ab"]["pairs"]]
    assert picks == winners and head["ab"]["revealed"] is True
    page.get_by_role("tab", name="Chat").click()


def test_qa_toasts_are_text_gallery_whole_and_changed_only_filter(page):  # noqa: F811 - the fixture
    _wait_ready(page)
    page.get_by_role("tab", name="QA bench").click()
    page.locator("#qa-prompts textarea").fill("a red fox\na blue boat")
    # A variant key (lowercased) echoed in the error toast stays text: no image element, no script.
    page.locator("#qa-variants textarea").fill('{"name": "x", "<img src=x onerror=window.__qapwned=1>": 1}')
    page.locator("#qa-run").click()
    toast = page.locator(".toast-body", has_text="unknown setting").first
    toast.wait_for(timeout=REPLY_TIMEOUT_MS)
    assert "<img src=x onerror=window.__qapwned=1>" in toast.inner_text()
    assert toast.locator("img").count() == 0 and page.evaluate("window.__qapwned") is None
    page.evaluate("document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click())")

    page.locator("#qa-kind").get_by_text("both", exact=True).click()
    page.locator("#qa-variants textarea").fill("small: size=64x64, steps=1, max_new_tokens=4, greedy=true\n"
                                               "wide: size=96x64, steps=1, max_new_tokens=4, seed=7")
    page.locator("#qa-run").click()
    _wait_value(page, "#qa-status", "Finished: 8/8 cells done")
    # Whole thumbnails (object-fit contain), each with its caption (cell, size, seed) visible.
    page.wait_for_function("() => document.querySelectorAll('#qa-gallery .thumbnail-item').length === 4")
    fits = page.locator("#qa-gallery .thumbnail-item img").evaluate_all(
        "imgs => imgs.map(i => getComputedStyle(i).objectFit)")
    assert set(fits) == {"contain"}, fits
    labels = [item.locator(".caption-label") for item in page.locator("#qa-gallery .thumbnail-item").all()]
    assert all(label.is_visible() for label in labels)
    texts = [label.inner_text() for label in labels]
    assert texts[1].startswith("cell 4 · #1 · wide · 96x64 · seed 7"), texts
    _shot(page, "qa-gallery")
    # The status line follows a re-run cell; Cell # is 1-based; a new run clears the form.
    page.locator("#qa-grid").get_by_text(re.compile(r"\[seed 7")).filter(visible=True).first.click()
    page.wait_for_function("() => document.querySelector('#qa-cell input').value === '3'")
    page.locator("#qa-comment textarea").fill("old note")
    page.locator("#qa-rerun").click()
    _wait_value(page, "#qa-status", "Re-ran cell 3: done · 8/8 cells done")

    page.locator("#qa-compare").click()
    _wait_value(page, "#qa-status", "Finished: 8/8 cells done")
    grid = page.locator("#qa-compare-grid")
    grid.get_by_text("What changed (0 of 8 cells changed)").first.wait_for(timeout=REPLY_TIMEOUT_MS)
    assert grid.get_by_text("same", exact=True).filter(visible=True).count() == 8  # fixed seeds: same output
    assert page.locator("#qa-cell input").input_value() == "0" and _value(page, "#qa-comment") == ""
    page.locator("#qa-only-changed input").check()
    page.wait_for_function("() => [...document.querySelectorAll('#qa-compare-grid td')]"
                           ".filter(td => td.offsetParent !== null && td.innerText.trim() === 'same').length === 0")
    assert page.evaluate(SEEN_SECTIONS_JS, ["#qa-diff"]) == []  # no diff box: nothing changed
    _shot(page, "qa-compare-only-changed")
    page.get_by_role("tab", name="Chat").click()


# What a refusal must leave alone: the status, the summary and grid tables, the gallery, the A/B pair and result.
KEPT = ("#qa-status", "#qa-summary", "#qa-grid", "#qa-gallery", "#qa-ab-heading", "#qa-ab-result")
KEPT_JS = """(ids) => Object.fromEntries(ids.map(id => {
  const el = document.querySelector(id);
  if (el === null) return [id, null];  // not on the page (the gallery of a chat-only set)
  const box = el.querySelector('textarea');
  return [id, {text: box ? box.value : el.innerText, errors: el.querySelectorAll('span.error').length}];
}))"""


def _refused(page, fragment: str, shot: str) -> None:
    """A warning toast (not an error one) saying ``fragment`` shows; screenshot it, then close it."""
    toast = page.locator(".toast-body.warning", has_text=fragment).first
    toast.wait_for(timeout=REPLY_TIMEOUT_MS)
    toast.evaluate("t => new Promise(done => { const check = () => getComputedStyle(t).opacity === '1' ? done() "
                   ": requestAnimationFrame(check); check(); })")  # faded in: readable in the screenshot
    _shot(page, shot)
    page.evaluate("document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click())")
    toast.wait_for(state="detached")


def test_a_refusal_is_a_toast_and_every_result_stays(page, tmp_path):  # noqa: F811 - the fixture
    _wait_ready(page)
    page.get_by_role("tab", name="QA bench").click()
    page.locator("#qa-kind").get_by_text("chat", exact=True).click()
    page.locator("#qa-prompts textarea").fill("Name a colour.\nCount to three.")
    page.locator("#qa-variants textarea").fill(VARIANTS)
    page.locator("#qa-run").click()
    _wait_value(page, "#qa-status", "Finished: 4/4 cells done")
    _open_accordion(page, "Blind A/B")
    page.locator("#qa-ab-start").click()
    for number, choice in ((1, "left"), (2, "right")):
        _wait_value(page, "#qa-ab-heading", f"Pair {number} of 2")
        page.locator(f"#qa-ab-pick-{choice}").click()
    _wait_value(page, "#qa-ab-heading", "Done: 2 of 2 pairs picked")
    before = page.evaluate(KEPT_JS, list(KEPT))
    assert before["#qa-ab-result"]["text"].startswith("cold vs hot: ") and "cold" in before["#qa-summary"]["text"]

    # Pasted prompts and a file: refused, and the last run's results stay on the page.
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("Say hello.\n", encoding="utf-8")
    page.locator("#qa-upload input[type=file]").set_input_files(str(prompts_file))
    page.locator("#qa-upload a[download='prompts.txt']").wait_for()  # uploaded: the server holds it
    page.locator("#qa-run").click()
    _refused(page, "not both", "qa-refusal-toast")
    assert page.evaluate(KEPT_JS, list(KEPT)) == before

    # Two prompt set files in one upload (the set goes with its images, one set at a time): refused.
    page.locator("#qa-upload button[aria-label='Clear']").click()
    other_file = tmp_path / "other.csv"
    other_file.write_text("prompt\nSay hi.\n", encoding="utf-8")
    page.locator("#qa-upload input[type=file]").set_input_files([str(prompts_file), str(other_file)])
    page.locator("#qa-upload a[download='other.csv']").wait_for()
    page.locator("#qa-run").click()
    _refused(page, "2 prompt set files were uploaded", "qa-upload-refusal-toast")
    assert page.evaluate(KEPT_JS, list(KEPT)) == before

    # One more pick after the last pair: refused, and the revealed result stays.
    page.locator("#qa-ab-pick-left").click()
    _refused(page, "Every pair is picked", "qa-ab-refusal-toast")
    after = page.evaluate(KEPT_JS, list(KEPT))
    assert after == before and not any(v and v["errors"] for v in after.values()), after
    page.locator("#qa-upload button[aria-label='Clear']").click()
    page.get_by_role("tab", name="Chat").click()


HEADERS_JS = """(selector) => [...document.querySelectorAll(selector + ' thead th')]
  .filter((th) => th.offsetParent !== null).map((th) => th.innerText.trim())"""


@pytest.mark.parametrize(("query", "tab", "first", "prompt"), [("en", "QA bench", "variant", "prompt"),
                                                                ("ar", "منصة ضمان الجودة", "المتغيّر", "الموجّه")])
def test_empty_qa_tables_show_their_headers_not_column_numbers(browser, app_url, query, tab, first, prompt):
    context, page = open_page(browser, f"{app_url}?lang={query}", "en-US")
    try:
        page.get_by_role("tab", name=tab).click()
        page.wait_for_function(f"() => ({HEADERS_JS})('#qa-summary').length > 3")
        summary, grid = page.evaluate(HEADERS_JS, "#qa-summary"), page.evaluate(HEADERS_JS, "#qa-grid")
        assert summary[0] == first and len(summary) == 11 and "1" not in summary, summary
        assert grid == ["#", prompt], grid
        _shot(page, f"qa-empty-tables-{query}", full_page=False)
    finally:
        context.close()
