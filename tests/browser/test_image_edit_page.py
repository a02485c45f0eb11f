"""Editing in the page: upload two references, see them as the model will, generate, paste the PNG back.

Screenshots of each step go to test-artifacts/screenshots/edit-*.png.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from support.browser import _generate, _open_accordion, _shot, _wait_image_sizes_ready, running_app


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


def test_upload_see_fitted_generate_and_paste_back(browser, edit_url, references, tmp_path):
    wide, tall, third = references
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(30_000)
    page = context.new_page()
    try:
        page.goto(edit_url)
        page.locator("#status-bar").wait_for()
        _wait_image_sizes_ready(page, edit_url)  # every size and edit slot warmed up; the Image tab open
        _open_accordion(page, "Edit from reference images")
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
    finally:
        context.close()


def _text_chunks(png: Image.Image):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in png.text.items():
        info.add_text(key, value)
    return info
