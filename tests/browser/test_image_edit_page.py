"""Editing in the page: upload two references, see them as the model will, generate, paste the PNG back;
reorder and remove references, and use a result as one.

Screenshots of each step go to test-artifacts/screenshots/edit-*.png.
"""

from __future__ import annotations

import base64
import contextlib
import json

import numpy as np
import pytest
from PIL import Image, ImageStat
from support.browser import (
    REPLY_TIMEOUT_MS,
    _choose_size,
    _generate,
    _open_accordion,
    _set_number,
    _shot,
    _steady_picture,
    _wait_image_sizes_ready,
    held,
    running_app,
    stop_held_image,
)


@pytest.fixture(scope="module")
def edit_url(chromium):
    with running_app("browser-edit-app.log", "--sizes", "64x64,96x64", "--references", "0,1,2", "--no-chat") as url:
        yield url


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    folder = tmp_path_factory.mktemp("refs")
    wide, tall, third = folder / "wide.png", folder / "tall.jpg", folder / "third.png"
    Image.new("RGB", (200, 100), (200, 30, 40)).save(wide)
    Image.new("RGB", (60, 120), (20, 200, 40)).save(tall)
    Image.new("RGB", (80, 80), (20, 40, 200)).save(third)
    return wide, tall, third


@contextlib.contextmanager
def edit_page(browser, edit_url: str, *permissions: str):
    """A fresh page on the editing app once every size and edit slot is warm (the Image tab open), its
    references box open; ``permissions`` granted to the app's origin (e.g. the clipboard's)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(30_000)
    if permissions:
        context.grant_permissions(list(permissions), origin=edit_url.rstrip("/"))
    page = context.new_page()
    try:
        page.goto(edit_url)
        page.locator("#status-bar").wait_for()
        _wait_image_sizes_ready(page, edit_url)
        _open_accordion(page, "Edit from reference images")
        yield page
    finally:
        context.close()


def test_upload_see_fitted_generate_and_paste_back(browser, edit_url, references, tmp_path):
    wide, tall, third = references
    with edit_page(browser, edit_url) as page:
        files = page.locator("#image-references input[type=file]")
        files.set_input_files([str(wide), str(tall), str(third), str(wide)])
        page.locator("#reference-note", has_text="4 reference images cannot be sent").wait_for()
        assert "this server edits with 0, 1, 2" in page.locator("#reference-note").inner_text()
        _shot(page, "edit-1-refused-count")
        page.locator("#image-references button[aria-label='Clear']").first.click()
        files.set_input_files([str(wide), str(tall)])
        page.locator("#reference-note", has_text="The model sees each reference at 64x64 (letterbox)").wait_for()
        page.locator("#reference-view img").nth(1).wait_for()
        _shot(page, "edit-2-fitted-letterbox")
        page.locator("#image-fit label", has_text="crop").click()
        page.locator("#reference-note", has_text="(crop)").wait_for()
        _shot(page, "edit-3-fitted-crop")
        # Mid-run, the image box shows the edit's live preview (a picture, not a blank box); then Stop ends it.
        page.locator("#image-prompt textarea").fill("the same shapes, slowly")
        _choose_size(page, "96x64")
        _set_number(page, "number input for Steps", 50)
        label = page.locator("#image-out [data-testid=block-label]")
        with held(edit_url, "image", after_steps=5):  # the run waits at step 5 for the picture and the Stop
            page.locator("#generate").click()
            label.filter(has_text="Preview · image 1 · step").wait_for()
            _, picture = _steady_picture(page)
            stat = ImageStat.Stat(picture.convert("L"))
            assert stat.stddev[0] > 8 and stat.mean[0] < 235, (stat.mean, stat.stddev)
            _shot(page, "edit-3b-preview-mid-run")
            stop_held_image(page)
        label.filter(has_text="stopped after").wait_for(timeout=REPLY_TIMEOUT_MS)
        png = _generate(page, "the same shapes, in blue", "96x64", 2)
        page.locator("#reference-note", has_text="at 96x64 (crop)").wait_for()  # the view follows the size
        _shot(page, "edit-4-result")
        made = json.loads(png.text["showcase"])
        assert [(r["name"], r["fit"], r["fitted_size"]) for r in made["references"]] == [
            ("wide.png", "crop", "96x64"), ("tall.jpg", "crop", "96x64")]
        assert png.size == (96, 64) and np.asarray(png).std() > 0
        saved = tmp_path / "edited.png"
        png.save(saved, pnginfo=_text_chunks(png))
        page.locator("#image-fit label", has_text="letterbox").click()
        _open_accordion(page, "Restore settings from a PNG")
        page.locator("#paste-png input[type=file]").set_input_files(str(saved))
        note = page.locator("#paste-note", has_text="edited from 2 reference images")
        note.wait_for()
        assert "wide.png, tall.jpg" in note.inner_text()
        page.wait_for_function("() => document.querySelector('#image-fit input[value=crop]').checked")
        _shot(page, "edit-5-pasted-back")


# Each preview in the reference view, its drawn picture (the image's content box, object-fit: contain) and its
# caption, against the part of the view the eye sees (the view's box, clipped by every scrolling parent).
PREVIEWS_JS = """() => {
  const view = document.querySelector('#reference-view');
  let clip = view.getBoundingClientRect();
  for (let e = view; e; e = e.parentElement) {
    const s = getComputedStyle(e);
    if (e !== view && !/(auto|scroll|hidden)/.test(s.overflow + s.overflowY)) continue;
    const r = e.getBoundingClientRect();
    clip = {left: Math.max(clip.left, r.left), right: Math.min(clip.right, r.right),
            top: Math.max(clip.top, r.top), bottom: Math.min(clip.bottom, r.bottom)};
  }
  return [...view.querySelectorAll('.thumbnail-item')].map(item => {
    const img = item.querySelector('img'), r = img.getBoundingClientRect();
    const scale = Math.min(r.width / img.naturalWidth, r.height / img.naturalHeight);
    const w = img.naturalWidth * scale, h = img.naturalHeight * scale;
    const drawn = {left: r.left + (r.width - w) / 2, right: r.right - (r.width - w) / 2,
                   top: r.top + (r.height - h) / 2, bottom: r.bottom - (r.height - h) / 2};
    const caption = item.querySelector('.caption-label') || item.parentElement.querySelector('.caption-label');
    const c = caption ? caption.getBoundingClientRect() : null;
    return {drawn, caption: c && {left: c.left, right: c.right, top: c.top, bottom: c.bottom},
            text: caption ? caption.innerText : '', full: caption ? caption.scrollWidth <= caption.clientWidth : false,
            clip};
  });
}"""


def _inside(inner: dict, outer: dict) -> bool:
    return all((inner["left"] >= outer["left"] - 1, inner["right"] <= outer["right"] + 1,
                inner["top"] >= outer["top"] - 1, inner["bottom"] <= outer["bottom"] + 1))


@pytest.mark.parametrize("fit", ["letterbox", "crop"])
def test_the_reference_view_shows_each_whole_preview_and_its_caption(browser, edit_url, references, fit):
    """"As the model will see them" shows all of each fitted preview (a letterbox's padding, a crop's edges) and
    its whole caption, inside the view's box."""
    wide, tall, _ = references
    with edit_page(browser, edit_url) as page:
        page.locator("#image-references input[type=file]").set_input_files([str(wide), str(tall)])
        page.locator("#reference-note", has_text="(letterbox)").wait_for()
        if fit == "crop":
            page.locator("#image-fit label", has_text="crop").click()
            page.locator("#reference-note", has_text="(crop)").wait_for()
        page.locator("#reference-view .thumbnail-item img").nth(1).wait_for()
        page.wait_for_function("() => [...document.querySelectorAll('#reference-view img')]"
                               ".every(i => i.complete && i.naturalWidth > 0)")
        page.locator("#reference-view").scroll_into_view_if_needed()
        page.locator("#reference-view").screenshot(path=str(_shot(page, f"edit-view-{fit}", full_page=False)))
        previews = page.evaluate(PREVIEWS_JS)
        assert len(previews) == 2
        for i, preview in enumerate(previews):
            assert preview["text"].startswith(f"{i + 1} · ") and f"· {fit}" in preview["text"], preview
            assert _inside(preview["drawn"], preview["clip"]), (fit, i, preview)  # the whole picture in view
            assert preview["caption"] and _inside(preview["caption"], preview["clip"]), (fit, i, preview)
            assert preview["full"], f"caption {i + 1} is cut: {preview['text']!r}"
            assert preview["caption"]["top"] >= preview["drawn"]["bottom"] - 1, "the caption covers the picture"


# What the eye sees of the Image tab's parts (in the layout, not hidden, with a size): by element id.
SEEN_IDS_JS = """(ids) => ids.filter(id => { const e = document.querySelector(id);
  if (!e || !e.checkVisibility({opacityProperty: true, visibilityProperty: true})) return false;
  const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; })"""
PARTS = ["#reference-earlier", "#reference-later", "#reference-remove", "#use-as-reference"]


def test_the_image_tab_offers_only_what_applies(browser, edit_url, references):
    """No reference buttons before a reference, no "Use this image" before an image, no upload or remove on the
    output PNG list, a gallery frame as tall as its thumbnails."""
    wide, _, _ = references
    with edit_page(browser, edit_url) as page:
        assert page.evaluate(SEEN_IDS_JS, PARTS) == []
        _shot(page, "edit-gaps-before")
        page.locator("#image-references input[type=file]").set_input_files([str(wide)])
        page.locator("#reference-earlier").wait_for()
        assert page.evaluate(SEEN_IDS_JS, PARTS) == PARTS[:3]
        _generate(page, "the same, in green", "64x64", 1)
        page.locator("#use-as-reference").wait_for()
        files = page.locator("#png-file")
        assert files.locator("button[aria-label=Remove], .upload-container, input[type=file]").count() == 0
        gallery, thumb = (page.locator(sel).first.bounding_box() for sel in ("#gallery", "#gallery .thumbnail-item"))
        _shot(page, "edit-gaps-after")
        assert gallery["height"] < thumb["height"] + 120, (gallery, thumb)  # the frame fits its one row


def test_reorder_remove_and_use_the_result_as_a_reference(browser, edit_url, references):
    wide, tall, _ = references
    with edit_page(browser, edit_url) as page:
        chosen = page.locator("#reference-chosen label")
        page.locator("#image-references input[type=file]").set_input_files([str(wide), str(tall)])
        chosen.nth(1).wait_for()
        assert chosen.all_inner_texts() == ["1 · wide.png", "2 · tall.jpg"]
        page.locator("#reference-view button.thumbnail-item").nth(1).click()  # a click in the view picks it too
        page.wait_for_function("() => document.querySelector('#reference-chosen input[value=\"1\"]').checked")
        page.locator("#reference-earlier").click()
        page.locator("#reference-chosen label", has_text="1 · tall.jpg").wait_for()
        assert chosen.all_inner_texts() == ["1 · tall.jpg", "2 · wide.png"]
        assert page.locator("#reference-chosen input[value='0']").is_checked()  # the choice follows its file
        _shot(page, "edit-6-reordered")
        chosen.nth(1).click()
        page.locator("#reference-remove").click()
        page.wait_for_function("() => document.querySelectorAll('#reference-chosen label').length === 1")
        assert chosen.all_inner_texts() == ["1 · tall.jpg"]
        first = _generate(page, "the same, at night", "64x64", 1)
        assert [r["name"] for r in json.loads(first.text["showcase"])["references"]] == ["tall.jpg"]
        page.locator("#use-as-reference").click()
        chosen.nth(1).wait_for()
        assert chosen.nth(1).inner_text().startswith("2 · ") and chosen.nth(1).inner_text().endswith(".png")
        page.locator("#reference-view img").nth(1).wait_for()
        _shot(page, "edit-7-result-as-reference")
        second = _generate(page, "the same, in the rain", "64x64", 1)
        refs = json.loads(second.text["showcase"])["references"]
        assert [(r["original_size"], r["fitted_size"]) for r in refs] == [("60x120", "64x64"), ("64x64", "64x64")]
        assert refs[0]["name"] == "tall.jpg" and refs[1]["name"].endswith(".png")


def test_paste_a_reference_from_the_clipboard(browser, edit_url, references):
    """An image copied elsewhere and pasted with the paste box's button becomes the next reference."""
    _, tall, third = references
    with edit_page(browser, edit_url, "clipboard-read", "clipboard-write") as page:
        chosen = page.locator("#reference-chosen label")
        page.locator("#image-references input[type=file]").set_input_files([str(tall)])
        chosen.first.wait_for()
        # The clipboard holds a PNG, as after "Copy image" in another tab.
        page.evaluate("""async (b64) => {
            const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
            await navigator.clipboard.write([new ClipboardItem({'image/png': new Blob([bytes], {type: 'image/png'})})]);
        }""", base64.b64encode(third.read_bytes()).decode())
        _shot(page, "edit-8-before-paste")
        page.locator("#reference-paste").get_by_role("button").first.click()
        chosen.nth(1).wait_for()
        assert chosen.nth(0).inner_text() == "1 · tall.jpg" and chosen.nth(1).inner_text().startswith("2 · ")
        page.locator("#reference-view img").nth(1).wait_for()
        page.wait_for_function("() => !document.querySelector('#reference-paste img')")  # the paste box emptied
        _shot(page, "edit-8-pasted")
        made = _generate(page, "the same, pasted", "64x64", 1)
        refs = json.loads(made.text["showcase"])["references"]
        assert [(r["original_size"], r["fitted_size"]) for r in refs] == [("60x120", "64x64"), ("80x80", "64x64")]


def _text_chunks(png: Image.Image):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in png.text.items():
        info.add_text(key, value)
    return info


def test_the_api_pages_edit_example_sends_a_reference(browser, edit_url):
    """"Use via API": /edit_image's example passes one picture as its reference (required), not gr.File's PDF."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(edit_url)
        page.get_by_text("Use via API").first.click()
        snippet = page.locator("code, pre").filter(has_text='api_name="/edit_image"').first
        snippet.scroll_into_view_if_needed()
        code = snippet.inner_text()
        _shot(page, "api-page-edit-example", full_page=False)
        assert "references=[handle_file('https://raw.githubusercontent.com/gradio-app/gradio/main/test/test_files/" \
               "bus.png')]" in code, code
        assert ".pdf" not in code
        assert page.evaluate("e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.top < innerHeight; }",
                             snippet.element_handle())
        assert page.get_by_text("references list[filepath] Required").count() == 1
    finally:
        context.close()
