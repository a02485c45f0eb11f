"""The Image tab in Arabic: text built at run time (progress, preview label, gallery captions,
notes in the parameters view) and the image backend's refusals read Arabic on an Arabic page, and read
exactly as before in English (what API clients, logs and the CLI get).

Refusals are triggered through the real code paths (the engine's request checks, size parsing, the
output folder); one browser test drives the page in Arabic on the demo models. A dropped PNG's note and
refusals: tests/tools/test_paste_back.py.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from support.i18n_check import english_phrases, has_arabic

from neuron_backend.devices import resolve_placements
from neuron_backend.errors import InvalidRequestError, ShowcaseError, UnsupportedSizeError
from neuron_backend.image.engine import ImageEngine, ImageRequest
from neuron_backend.image.png_info import OutputFolder
from neuron_backend.messages import CATALOG, Message, fields
from neuron_backend.shapes import ImageSize, choose_bucket
from ui import i18n
from ui.api import shown
from ui.image_tab import (
    caption,
    gallery_value,
    image_label,
    image_snippet,
    params_view,
    preview_label,
    progress_text,
)

SIZES = (ImageSize(64, 64), ImageSize(96, 64))
ALLOWED_LATIN = ("A1111",)  # a tool's name


@pytest.fixture
def settings(tiny_settings):
    return tiny_settings.replace(sizes=SIZES, max_steps=6, max_images_per_run=4)


@pytest.fixture
def engine(settings):
    """The image engine, not loaded: its request checks run without a model."""
    return ImageEngine(settings, resolve_placements(settings)["image"], "tiny/flux2-klein")


def _arabic(text: str) -> None:
    assert has_arabic(text), text
    assert english_phrases(text, allowed=ALLOWED_LATIN) == [], text


def _params(**changes) -> dict:
    return {"prompt": "a red fox", "seed": 7, "size": "64x64", "steps": 4, "steps_done": 4, "stopped": False,
            "guidance": None, **changes}


# -- the tab's run-time text --------------------------------------------------------------------------

def test_a_stopped_image_says_so_in_its_label():
    stopped = _params(stopped=True, steps_done=2)
    assert image_label(stopped) == "Image · stopped after 2 of 4 steps"
    assert image_label(_params()).key == i18n.t("Image").key  # the plain label otherwise
    with i18n.speaking("ar"):
        _arabic(image_label(stopped))
        assert "2" in image_label(stopped) and "4" in image_label(stopped)


def test_run_time_texts_read_arabic_on_an_arabic_page():
    frame = SimpleNamespace(index=0, step=3, total=8)
    with i18n.speaking("ar"):
        texts = {
            "caption": caption(_params()),
            "caption stopped": caption(_params(stopped=True, steps_done=2)),
            "gallery": gallery_value([{"path": "a.png", "params": _params()}])[0][1],
            "progress": progress_text(3, 8, 1.5),
            "waiting": i18n.say("starting (or waiting for the image engine)"),
            "unit": i18n.say("steps"),
            "preview": preview_label(frame),
        }
    for text in texts.values():
        _arabic(text)
    assert texts["caption stopped"] == "البذرة 7 · 64x64 · أُوقفت عند 2/4"
    assert texts["progress"] == "الخطوة 3/8 · يتبقى ~2.5 ث"


def test_run_time_texts_read_as_before_in_english():
    assert caption(_params(stopped=True, steps_done=2)) == "seed 7 · 64x64 · stopped 2/4"
    assert progress_text(3, 8, 1.5) == "step 3/8 · ~2.5 s left"
    assert preview_label(SimpleNamespace(index=1, step=3, total=8)) == "Preview · image 2 · step 3/8"


def test_the_parameters_view_shows_notes_in_the_pages_language(tmp_path):
    saved = OutputFolder(tmp_path, 0).save(None, {}, stem="x")  # --max-saved-images 0
    params = _params(save_note=saved.problem, model=Message("Steps"))
    with i18n.speaking("ar"):
        view = params_view(params)
    _arabic(view["save_note"])
    assert "--max-saved-images" in view["save_note"]
    assert view["model"] == "Steps"  # any other value (a Message too, e.g. a demo model's name): as the API has it
    assert {k: v for k, v in view.items() if k != "save_note"} == {k: v for k, v in params.items() if k != "save_note"}
    assert params_view(params)["save_note"] == "not saved: --max-saved-images is 0"  # English (and the API) as before


def test_a_several_image_run_snippet_makes_the_whole_run():
    run = [_params(seed=7, run_image=1, run_images=3), _params(seed=8, run_image=2, run_images=3),
           _params(seed=9, run_image=3, run_images=3)]
    code = image_snippet("http://127.0.0.1:7860/", run[0], run)
    compile(code, "snippet", "exec")
    assert "png_paths, params_list = client.predict(" in code and "seed=7," in code and "images=3," in code
    one = image_snippet("http://127.0.0.1:7860/", run[1])  # one image picked in the gallery: that image alone
    assert "images=" not in one and "seed=8," in one and "png_path, params = client.predict(" in one
    stopped = image_snippet("http://127.0.0.1:7860/", run[0], [run[0], {**run[1], "stopped": True, "steps_done": 2}])
    compile(stopped, "snippet", "exec")
    assert stopped.startswith("# This run was stopped: 2 of 3 images were made, the last after 2 of 4 steps.")
    assert "images=3," in stopped
    with i18n.speaking("ar"):  # code stays English
        assert image_snippet("http://127.0.0.1:7860/", run[0], run) == code


# -- the backend's refusals --------------------------------------------------------------------------

def test_field_names_in_refusals_read_as_the_tabs_labels():
    """A refusal names the control the visitor sees, in either language (no "Temperature"-like mismatch)."""
    for label in ("Steps", "Seed", "Images per run", "Guidance"):  # the tab's labels (ui/image_tab.py) are the
        assert label in CATALOG and CATALOG[label]                   # refusals' names


@pytest.mark.parametrize(("changes", "key", "arabic"), [
    ({"prompt": ""}, "The prompt is empty: describe the image you want.", "الموجّه فارغ"),
    ({"prompt": None}, "The prompt must be text, not {kind}.", "نصًا"),
    ({"prompt": "x" * 20_001}, "The prompt is {length} characters; the limit is {limit}. Shorten it.", "20000"),
    ({"steps": 7}, "{name} {value} is out of range: use a whole number from {low} to {high}.", "«الخطوات»"),
    ({"steps": 2.5}, "{name} must be a whole number from {low} to {high}, not {value}.", "«الخطوات»"),
    ({"seed": -1}, "{name} {value} is out of range: use a whole number from {low} to {high}.", "«البذرة»"),
    ({"count": 5},
     "{name} {value} is out of range: use a whole number from {low} to {high}.", "«عدد الصور في كل تشغيل»"),
    ({"guidance": "high"}, "{name} must be a number from {low} to {high}, not {value}.", "«قوة التوجيه»"),
    ({"guidance": 25.0}, "{name} {value} is out of range: use a number from {low} to {high}.", "«قوة التوجيه»"),
    ({"size": "1024"}, "{error} Allowed sizes: {allowed}.", "غير سليم الصيغة"),
    ({"size": "72x64"}, "{error} Allowed sizes: {allowed}.", "مضاعفات 16"),
    ({"size": "256x256"},
     "Image size {size} is not served here (each size is compiled ahead of time). Allowed sizes: {allowed}.",
     "64x64, 96x64"),
])
def test_request_refusals_read_arabic(engine, changes, key, arabic):
    request = ImageRequest(**{"prompt": "a fox", "size": "64x64", "steps": 2, **changes})
    with pytest.raises(InvalidRequestError) as caught:
        engine.validate(request)
    assert caught.value.args[0].template == key
    english = str(caught.value)
    with i18n.speaking("ar"):
        text = i18n.localized(caught.value)
        toast = shown(caught.value)
    _arabic(text)
    assert arabic in text and toast == text.replace("<", "&lt;")
    assert fields(key) == fields(CATALOG[key])
    assert i18n.localized(caught.value) == english  # English, as API clients read it


def test_english_refusals_read_as_before(engine):
    cases = [({"steps": 7}, "Steps 7 is out of range: use a whole number from 1 to 6."),
             ({"count": 2.0}, "Images per run must be a whole number from 1 to 4, not 2.0."),
             ({"size": "1024"}, "Image size '1024' is malformed: write it as WIDTHxHEIGHT, e.g. '1024x1024'. "
                                "Allowed sizes: 64x64, 96x64."),
             ({"guidance": 25.0}, "Guidance 25.0 is out of range: use a number from 1 to 20.")]
    for changes, expected in cases:
        with pytest.raises(InvalidRequestError) as caught:
            engine.validate(ImageRequest(**{"prompt": "a fox", "size": "64x64", **changes}))
        assert str(caught.value) == expected


def test_shape_refusals_read_arabic():
    key = ("The prompt is {tokens} tokens; the longest prompt this server accepts is {limit} tokens. Shorten the "
           "message.")
    with pytest.raises(ShowcaseError) as caught:
        choose_bucket(300, (64, 128))
    assert caught.value.args[0].template == key
    with i18n.speaking("ar"):
        text = i18n.localized(caught.value)
    _arabic(text)
    assert not isinstance(caught.value, UnsupportedSizeError)


def test_engine_not_loaded_and_not_saved_read_arabic(engine, tmp_path):
    from neuron_backend.errors import EngineUnavailableError

    with pytest.raises(EngineUnavailableError) as caught:
        engine.generate_run(ImageRequest("a fox", "64x64", steps=1))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    problem = OutputFolder(blocked, 5).save(None, {}, stem="x").problem  # the folder is a file: cannot write
    assert isinstance(problem, Message) and problem.startswith("not saved: could not write to")
    with i18n.speaking("ar"):
        for text in (i18n.localized(caught.value), i18n.localized(problem)):
            _arabic(re.sub(r"\([\u2066\u2068]?\[Errno.*\)", "", text))  # the OS's own reason stays as it is


def test_ignored_guidance_note_reads_arabic_in_the_parameters_view(settings, demo_models):
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "tiny/flux2-klein")
    engine.load(demo_models.image)  # the demo pipeline is distilled, like FLUX.2-klein
    engine.shapes.mark_ready(ImageSize(64, 64))
    result = engine.generate(ImageRequest("a fox", "64x64", steps=1, seed=3, guidance=3.0))
    note = result.params["guidance_note"]
    assert note == "guidance 3.0 ignored: tiny/flux2-klein is step-distilled and runs without classifier-free guidance"
    with i18n.speaking("ar"):
        text = params_view(result.params)["guidance_note"]
    assert has_arabic(text) and english_phrases(text, allowed=("classifier-free guidance",)) == [], text


# -- in the browser ------------------------------------------------------------------------------------


