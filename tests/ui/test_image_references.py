"""The Image tab's references box: each reference shown as the model will see it, refusals said plainly."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from support.app import start_app
from support.i18n_check import has_arabic

from neuron_backend.errors import InvalidRequestError
from neuron_backend.image.references import LETTERBOX_FILL
from neuron_backend.shapes import ImageSize
from ui import i18n
from ui.image_references import fitted_view, moved, reference_choices, references_of, removed, with_pasted, with_result


@pytest.fixture
def settings(tiny_settings):
    return tiny_settings.replace(sizes=(ImageSize(64, 64), ImageSize(96, 64)), references=(0, 1, 2))


@pytest.fixture
def files(tmp_path):
    wide, tall = tmp_path / "wide.png", tmp_path / "tall.jpg"
    Image.new("RGB", (200, 100), (200, 30, 40)).save(wide)
    Image.new("RGB", (60, 120), (20, 200, 40)).save(tall)
    (tmp_path / "notes.txt").write_text("not an image")
    return wide, tall, tmp_path / "notes.txt"


def test_the_view_shows_each_reference_fitted_for_the_size_picked(settings, files):
    wide, tall, _ = files
    view, note = fitted_view(settings, [str(wide), str(tall)], "letterbox", "64x64")
    assert view["visible"] is True and note == "The model sees each reference at 64x64 (letterbox)."
    (first, first_caption), (_, second_caption) = view["value"]
    assert first.size == (64, 64) and first_caption == "1 · 200x100 → 64x64 · letterbox"
    assert second_caption == "2 · 60x120 → 64x64 · letterbox"
    pixels = np.asarray(first)
    assert (pixels[:16] == LETTERBOX_FILL).all() and (pixels[20:44] == (200, 30, 40)).all()  # the padding drawn
    view, note = fitted_view(settings, [str(wide)], "crop", "96x64")
    assert view["value"][0][0].size == (96, 64) and (np.asarray(view["value"][0][0]) == (200, 30, 40)).all()
    assert note == "The model sees each reference at 96x64 (crop)."
    assert fitted_view(settings, None, "crop", "96x64") == ({"__type__": "update", "value": None, "visible": False},
                                                             "")


def test_a_count_not_served_is_said_before_anything_is_sent(settings, files):
    wide, tall, text = files
    view, note = fitted_view(settings, [str(wide), str(tall), str(wide)], "letterbox", "64x64")
    assert view["visible"] is False
    assert note == ("**3 reference images cannot be sent:** this server edits with 0, 1, 2 (each count is compiled "
                    "ahead of time). Remove some.")
    with i18n.speaking("ar"):
        _, arabic = fitted_view(settings, [str(wide)] * 3, "letterbox", "64x64")
    assert has_arabic(arabic) and "0, 1, 2" in arabic
    _, refused = fitted_view(settings, [str(text)], "letterbox", "64x64")
    assert refused == "Reference 'notes.txt' is not an image that can be read; send PNG, JPEG, WEBP."
    with pytest.raises(InvalidRequestError, match="3 reference images are not served"):  # the count before the files
        references_of([str(text)] * 3, "crop", settings)
    assert [r.fit for r in references_of([str(wide), str(tall)], "crop", settings)] == ["crop", "crop"]
    assert references_of(None, None, settings) == ()


def test_a_reference_over_the_pixel_limit_is_refused_from_its_header_on_the_page(settings, tmp_path):
    big = tmp_path / "big.png"
    Image.new("1", (2049, 2048)).save(big)  # 4 MP and a column: over the limit of sizes this small
    said = ("Reference 'big.png' is 2049x2048 pixels; this server takes references of at most 4194304 pixels "
            "(4.0 megapixels). Send a smaller image.")
    assert fitted_view(settings, [str(big)], "letterbox", "64x64")[1] == said
    with pytest.raises(InvalidRequestError) as refused:
        references_of([str(big)], "crop", settings)
    assert str(refused.value) == said
    with i18n.speaking("ar"):
        assert has_arabic(fitted_view(settings, [str(big)], "letterbox", "64x64")[1])


@pytest.mark.slow
def test_the_box_is_on_the_page_only_where_editing_is_served(tmp_path, warm_app):
    def elem_ids(config):
        return {c.get("props", {}).get("elem_id") for c in config["components"]}

    import httpx

    _, plain_url = warm_app  # --references 0
    assert "image-references" not in elem_ids(httpx.get(f"{plain_url}config").json())
    demo, _, url = start_app(tmp_path, "--references", "0,1", "--no-chat")
    try:
        assert {"image-references", "image-fit", "reference-view", "reference-note", "reference-chosen",
                "reference-earlier", "reference-later", "reference-remove", "use-as-reference"} <= elem_ids(
            httpx.get(f"{url}config").json())
    finally:
        demo.close()


def test_the_chosen_reference_moves_and_is_removed_and_the_order_is_what_is_sent(settings, files):
    wide, tall, _ = files
    third = wide.with_name("third.png")
    Image.new("RGB", (64, 64), (1, 2, 3)).save(third)
    paths = [str(wide), str(tall), str(third)]
    choices = reference_choices(paths, 1)
    assert choices["choices"] == [("1 · wide.png", 0), ("2 · tall.jpg", 1), ("3 · third.png", 2)]
    assert choices["value"] == 1 and choices["visible"] is True
    assert reference_choices(paths[:1], 2)["value"] is None  # the chosen one has gone: none chosen
    assert reference_choices(None, 0) == {"__type__": "update", "choices": [], "value": None, "visible": False}

    assert moved(paths, 1, -1) == ([str(tall), str(wide), str(third)], 0)  # the chosen one follows its file
    assert moved(paths, 1, 1) == ([str(wide), str(third), str(tall)], 2)
    assert moved(paths, 0, -1) == (paths, 0) and moved(paths, 2, 1) == (paths, 2)  # at the ends: stays
    assert removed(paths, 1) == ([str(wide), str(third)], 1)
    assert removed(paths, 2) == ([str(wide), str(tall)], 1) and removed([str(wide)], 0) == (None, None)
    for nothing_chosen in (None, 5):
        assert moved(paths, nothing_chosen, 1) == ({"__type__": "update"},) * 2
        assert removed(paths, nothing_chosen) == ({"__type__": "update"},) * 2
    reordered, _ = moved(paths[:2], 1, -1)
    assert [r.sha256 for r in references_of(reordered, "crop", settings)] == [
        r.sha256 for r in reversed(references_of(paths[:2], "crop", settings))]  # the order sent


def test_the_result_shown_becomes_the_last_reference(settings, files, tmp_path):
    wide, _, _ = files
    made = tmp_path / "image-7.png"
    Image.new("RGB", (96, 64), (9, 9, 9)).save(made)
    assert with_result([str(wide)], [str(made), str(wide)]) == (
        [str(wide), str(made)], {"__type__": "update", "open": True})  # the first of a run's PNGs, as shown
    assert with_result(None, str(made))[0] == [str(made)]
    assert with_result([str(wide)], None) == ({"__type__": "update"},) * 2  # nothing shown yet: kept
    view, _ = fitted_view(settings, with_result([str(wide)], [str(made)])[0], "letterbox", "96x64")
    assert [caption for _, caption in view["value"]][1] == "2 · 96x64 → 96x64 · letterbox"


def test_a_pasted_image_becomes_the_last_reference_and_the_paste_box_empties(files, tmp_path):
    wide, tall, _ = files
    pasted = tmp_path / "clipboard.png"
    Image.new("RGB", (32, 32), (1, 2, 3)).save(pasted)
    assert with_pasted([str(wide), str(tall)], str(pasted)) == ([str(wide), str(tall), str(pasted)], None)
    assert with_pasted(None, str(pasted)) == ([str(pasted)], None)
    assert with_pasted([str(wide)], None) == ({"__type__": "update"},) * 2  # the box emptied: nothing to add
