"""Paste-back as a plug-in: a PNG's settings read from its text chunks (ours and A1111-style), checked against this
server, bounded and refused plainly; the Image tab's drop box with its note, in English and Arabic; ``/paste_png``
for API clients; the page without the plug-in has neither. The settings-line scanner the A1111 parser shares with
the core's infotext reader: tests/core/test_png_text.py.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
import zlib

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from support.app import app_parts, app_settings
from support.i18n_check import english_phrases, has_arabic
from support.png_text import HUGE, MB, NESTED, SHAPES, child_timings, png_with

import ui
from app import PLUGINS
from neuron_backend.devices import resolve_placements
from neuron_backend.errors import InvalidRequestError, ShowcaseError, UnsupportedSizeError
from neuron_backend.image.engine import ImageEngine, ImageRequest
from neuron_backend.image.png_info import MAX_SETTINGS_CHARS
from neuron_backend.runtime import Backend
from neuron_backend.shapes import ImageSize
from tools.paste_back import plugin, png_settings
from tools.paste_back.drop_box import restored_text
from tools.paste_back.png_settings import (
    MAX_PNG_BYTES,
    parse_a1111,
    png_text_chunks,
    read_settings,
    settings_from_chunks,
)
from ui import i18n

SIZES = (ImageSize(64, 64), ImageSize(96, 64))
ALLOWED_LATIN = ("A1111",)  # a tool's name


@pytest.fixture
def settings(tiny_settings):
    return tiny_settings.replace(sizes=SIZES, max_steps=60)


@pytest.fixture
def tab_settings(tiny_settings):
    """The Image tab's tests' settings: at most 6 steps."""
    return tiny_settings.replace(sizes=SIZES, max_steps=6, max_images_per_run=4)


def _arabic(text: str) -> None:
    assert has_arabic(text), text
    assert english_phrases(text, allowed=ALLOWED_LATIN) == [], text


def _pasted(settings, **raw):
    line = ", ".join(f"{k}: {v}" for k, v in raw.items())
    return settings_from_chunks({"parameters": f"a blue whale\n{line}"}, settings)


def a1111_png(path, size="96x64", steps=12, seed=77, extra=""):
    info = PngInfo()
    info.add_text("parameters", f"a red fox\nNegative prompt: blurry\nSteps: {steps}, Sampler: Euler a, "
                                f"CFG scale: 3.5, Seed: {seed}, Size: {size}{extra}, Model: sdxl")
    Image.new("RGB", (8, 8)).save(path, pnginfo=info)
    return path


# -- the plug-in's seam -------------------------------------------------------------------------------

def _page(tmp_path, with_plug_in: bool):
    """The page of an app that edits (the references' fit control is there), with or without the plug-in."""
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--sizes",
                             "64x64", "--references", "0,1"])
    extras = app_parts(settings).image_extras if with_plug_in else ()
    return ui.create_demo(Backend(settings), image_extras=extras)


def _element(demo, elem_id):
    return next((b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id), None)


def test_the_core_alone_has_no_drop_box_and_the_plug_in_puts_it_where_it_stood(tmp_path):
    assert plugin in PLUGINS and plugin.plug(None).image_extras  # app.py serves it; no flags to read
    bare = _page(tmp_path, with_plug_in=False)
    assert _element(bare, "image-guidance") is not None and _element(bare, "image-fit") is not None
    assert _element(bare, "paste-png") is None and _element(bare, "paste-note") is None
    assert "paste_png" not in {d.get("api_name") for d in bare.config["dependencies"]}
    assert not [f for f in bare.fns.values() if f.name in ("pasted_fields", "pasted_values", "pasted_fit")]

    page = _page(tmp_path, with_plug_in=True)
    box = _element(page, "paste-png")
    assert box is not None and _element(page, "paste-note") is not None
    # in the settings column, right under the references box and above the examples, as before
    column = box.parent.parent
    kinds = [(type(c).__name__, getattr(c, "elem_id", None)) for c in column.children]
    at = kinds.index(("Accordion", "image-references-box"))
    assert column.children[at + 1] is box.parent and kinds[-1][0] == "Dataset"
    [api] = [f for f in page.fns.values() if f.api_name == "paste_png"]
    assert api.api_visibility == "undocumented" and api.name == "pasted_values"
    assert [o.elem_id for o in api.outputs] == ["image-prompt", "image-size", "image-steps", "image-seed",
                                                "image-randomize", "image-guidance", "paste-note"]
    [fit] = [f for f in page.fns.values() if f.name == "pasted_fit"]  # an edit's PNG sets the fit mode
    assert [o.elem_id for o in fit.outputs] == ["image-fit"] and [i.elem_id for i in fit.inputs] == ["paste-png"]


# -- reading a PNG's settings -------------------------------------------------------------------------

@pytest.fixture
def engine(settings, demo_models):
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "tiny/flux2-klein")
    engine.load(demo_models.image)
    return engine


def test_paste_back_reads_our_pngs_and_a1111_infotext(engine, settings, tmp_path):
    ours = engine.generate(ImageRequest("a lighthouse, watercolor", "96x64", steps=3, seed=9))
    pasted = read_settings(ours.path, settings)
    assert (pasted.prompt, pasted.size, pasted.steps, pasted.seed, pasted.source) == (
        "a lighthouse, watercolor", "96x64", 3, 9, "showcase")
    other = read_settings(a1111_png(tmp_path / "a.png"), settings)
    assert (other.prompt, other.size, other.steps, other.seed, other.guidance, other.source) == (
        "a red fox", "96x64", 12, 77, 3.5, "infotext")
    assert other.as_row() == {"prompt": "a red fox", "size": "96x64", "steps": 12, "seed": 77, "guidance": 3.5}


def test_paste_back_refuses_what_it_cannot_use(settings, tmp_path):
    with pytest.raises(UnsupportedSizeError, match="512x512.*Allowed sizes: 64x64, 96x64"):
        read_settings(a1111_png(tmp_path / "big.png", size="512x512"), settings)
    Image.new("RGB", (8, 8)).save(tmp_path / "plain.png")
    with pytest.raises(InvalidRequestError, match="no generation parameters"):
        read_settings(tmp_path / "plain.png", settings)
    (tmp_path / "fake.png").write_bytes(b"GIF89a not a png")
    with pytest.raises(InvalidRequestError, match="not a PNG"):
        read_settings(tmp_path / "fake.png", settings)
    with open(tmp_path / "huge.png", "wb") as handle:
        handle.truncate(MAX_PNG_BYTES + 1)
    with pytest.raises(InvalidRequestError, match="over 64 MB"):
        read_settings(tmp_path / "huge.png", settings)
    with pytest.raises(InvalidRequestError, match="1 to 60"):
        read_settings(a1111_png(tmp_path / "steps.png", steps=500), settings)


def test_paste_back_reads_text_chunks_only_and_bounds_them(tmp_path):
    # A pixel bomb: 20000 x 20000 px compress to almost nothing; the reader never inflates pixels.
    bomb = tmp_path / "bomb.png"

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    text = zlib.compress(b"x" * (50 * 2**20), 9)  # a zTXt chunk that would inflate to 50 MB
    bomb.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"zTXt", b"parameters\0\0" + text)
                     + chunk(b"IDAT", zlib.compress(b"\0" * 10**6)) + chunk(b"IEND", b""))
    chunks = png_text_chunks(bomb.read_bytes())
    assert len(chunks["parameters"]) == 2**20  # stopped at the text budget


# -- untrusted text: the A1111 parser and hostile PNGs ------------------------------------------------

def test_a1111_quoted_values_parse_as_before():
    a1111 = parse_a1111("a fox\nNegative prompt: blur\n" + r'Steps: 20, Sampler: "x, y", Bad: "no\, Seed: 1')
    assert a1111 == {"prompt": "a fox", "negative_prompt": "blur", "Steps": "20", "Sampler": "x, y",
                     "Bad": "no\\", "Seed": "1"}


@pytest.mark.slow
def test_adversarial_settings_lines_parse_in_linear_time_in_a1111_text():
    timings = child_timings("tools.paste_back.png_settings", "parse_a1111")
    assert len(timings) == 2 * len(SHAPES)
    slow = [row for row in timings if row[3] > 0.5]
    assert not slow, slow


def test_a_settings_line_over_the_cap_is_refused(tmp_path, tiny_settings):
    head = "Steps: 4, Size: 64x64, Seed: 1, Note: "
    fits = head + "n" * (MAX_SETTINGS_CHARS - len(head))
    assert len(fits) == MAX_SETTINGS_CHARS
    assert parse_a1111("a fox\n" + fits)["Size"] == "64x64"
    over = fits + "n"
    with pytest.raises(InvalidRequestError, match=f"{len(over)} characters long; at most {MAX_SETTINGS_CHARS}"):
        parse_a1111("a fox\n" + over)
    info = PngInfo()
    info.add_text("parameters", "a fox\nSteps: 4, " + "a" * MB)
    Image.new("RGB", (8, 8)).save(tmp_path / "long.png", pnginfo=info)
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_SETTINGS_CHARS} characters are read"):
        read_settings(tmp_path / "long.png", tiny_settings)


HOSTILE_PNGS = {  # showcase chunk -> what the refusal says
    "nested": (NESTED, "has no generation parameters"),
    "nested prompt": ('{"prompt": ' + NESTED + ', "size": "64x64"}', "has no generation parameters"),
    "surrogate": (json.dumps({"prompt": "a \ud800 cat", "size": "64x64"}), "lone surrogate"),
    "huge size": (json.dumps({"prompt": "cat", "size": HUGE + "x64"}), "between 16 and 4096. Allowed sizes: "),
    "huge number": ('{"prompt": "cat", "size": "64x64", "seed": ' + HUGE + "}", "has no generation parameters"),
}


@pytest.mark.parametrize("case", HOSTILE_PNGS)
def test_hostile_parameters_are_refused_plainly(tmp_path, tiny_settings, case):
    chunk, fragment = HOSTILE_PNGS[case]
    path = png_with(tmp_path / "hostile.png", showcase=chunk)
    with pytest.raises(InvalidRequestError) as raised:
        read_settings(path, tiny_settings)
    message = str(raised.value)
    assert fragment in message and len(message) < 400
    assert not any(python in message for python in ("recursion", "Exceeds the limit", "codec", "surrogates not"))


# -- the note and the refusals in the page's language -------------------------------------------------

def test_the_restored_note_reads_arabic_on_an_arabic_page(tab_settings):
    pasted = _pasted(tab_settings, **{"Steps": 4, "Sampler": "Euler", "CFG scale": 99, "Seed": 2**33,
                                      "Size": "64x64"})
    with i18n.speaking("ar"):
        texts = {
            "restored": restored_text(pasted),
            "restored (ours)": restored_text(dataclasses.replace(pasted, source="showcase", notes=())),
        }
    for text in texts.values():
        _arabic(text)
    assert texts["restored"].count("؛") == 2  # both notes (seed and guidance out of range), Arabic separator


def test_the_restored_note_reads_as_before_in_english(tab_settings):
    pasted = _pasted(tab_settings, **{"Steps": 4, "Seed": 2**33, "Size": "64x64"})
    assert restored_text(pasted) == (f"Restored from the PNG (its A1111-style parameters text): size 64x64; "
                                     f"seed {2**33} is outside 0..{2**32 - 1}: a random seed is used.")


def _not_png(tmp_path, settings):
    path = tmp_path / "fake.png"
    path.write_text("not an image")
    return read_settings(path, settings)


def _too_big(tmp_path, settings, monkeypatch):
    monkeypatch.setattr(png_settings, "MAX_PNG_BYTES", 2**20)
    path = tmp_path / "big.png"
    path.write_bytes(png_settings.PNG_SIGNATURE + b"\0" * 2**20)
    return read_settings(path, settings)


@pytest.mark.parametrize(("trigger", "key"), [
    (lambda tmp, s, mp: _not_png(tmp, s), "This file is not a PNG: drop a PNG made by this app or another image tool."),
    (lambda tmp, s, mp: _too_big(tmp, s, mp), "This PNG is over {mb} MB; only smaller files are read."),
    (lambda tmp, s, mp: settings_from_chunks({"comment": "hello"}, s),
     "This PNG has no generation parameters (no 'parameters' or 'showcase' text): drop a PNG saved by this app or by "
     "an A1111-style tool."),
    (lambda tmp, s, mp: settings_from_chunks({"parameters": "a fox\nSteps: 4, " + "a" * 20_000}, s),
     "This PNG's settings line (the one starting 'Steps:') is {chars} characters long; at most {limit} characters are "
     "read."),
    (lambda tmp, s, mp: _pasted(s, Steps=4, Seed=1), "This PNG does not say its size. Allowed sizes: {allowed}."),
    (lambda tmp, s, mp: _pasted(s, Steps=4, Size="512x512"),
     "This image is {size}, which is not served here (each size is compiled ahead of time). Allowed sizes: {allowed}."),
    (lambda tmp, s, mp: _pasted(s, Steps=4, Size="512"), "{error} Allowed sizes: {allowed}."),
    (lambda tmp, s, mp: _pasted(s, Steps=60, Size="64x64"),
     "This image used {steps} steps; this server allows 1 to {max_steps}."),
    (lambda tmp, s, mp: settings_from_chunks({"parameters": "\nSteps: 4, Size: 64x64"}, s),
     "The prompt is empty: describe the image you want."),
])
def test_dropped_png_refusals_read_arabic(tmp_path, tab_settings, monkeypatch, trigger, key):
    with pytest.raises(ShowcaseError) as caught:
        trigger(tmp_path, tab_settings, monkeypatch)
    assert caught.value.args[0].template == key
    with i18n.speaking("ar"):
        text = i18n.localized(caught.value)
    _arabic(text)
    size_refusals = ("This PNG does not say its size. Allowed sizes: {allowed}.",
                     "This image is {size}, which is not served here (each size is compiled ahead of time). "
                     "Allowed sizes: {allowed}.",
                     "{error} Allowed sizes: {allowed}.")
    assert isinstance(caught.value, UnsupportedSizeError) == (key in size_refusals)


# -- through the API: the app as app.py serves it (tests/support/app.py) -------------------------------

def test_api_paste_back(warm_app, tmp_path):
    _, url = warm_app
    client = Client(url, verbose=False)
    values = client.predict(handle_file(str(a1111_png(tmp_path / "a.png"))), api_name="/paste_png")
    assert list(values[:6]) == ["a red fox", "96x64", 12, 77, False, 3.5] and "Restored" in values[6]
    info = PngInfo()
    info.add_text("parameters", "a lighthouse\nSteps: 2, Size: 96x64")  # no seed, no guidance
    Image.new("RGB", (8, 8)).save(tmp_path / "c.png", pnginfo=info)
    values = client.predict(handle_file(str(tmp_path / "c.png")), api_name="/paste_png")
    # values, never the page's "keep this field" update: no seed (randomize), guidance the slider's 1.0 (none)
    assert list(values[:6]) == ["a lighthouse", "96x64", 2, None, True, 1.0]
    with pytest.raises(AppError, match="512x512") as refused:  # nothing filled in; the page shows a toast
        client.predict(handle_file(str(a1111_png(tmp_path / "b.png", size="512x512"))), api_name="/paste_png")
    assert "Traceback" not in str(refused.value)


@pytest.mark.slow
def test_a_hostile_png_leaves_the_server_answering(warm_app, tmp_path, monkeypatch):
    """The settings line is parsed in linear time: the parse's own CPU time is the measure (a quadratic parse
    of 16,000 characters took seconds of it, holding the GIL), not the wall-clock gaps between /healthz
    answers, which another busy process on the host stretches too; /healthz answers all the while."""
    _, served = warm_app
    parsed = []  # CPU seconds of each parse, on the thread that ran it

    def timed(text, real=png_settings.parse_a1111):
        started = time.thread_time()
        try:
            return real(text)
        finally:
            parsed.append(time.thread_time() - started)

    monkeypatch.setattr(png_settings, "parse_a1111", timed)
    client = Client(served, verbose=False)
    for name, chars in (("under the cap", 16_000), ("over the cap", 64 * 1024)):
        parsed.clear()
        info = PngInfo()
        info.add_text("parameters", "a fox\nSteps: 4, " + "a" * chars)
        path = tmp_path / f"{chars}.png"
        Image.new("RGB", (8, 8)).save(path, pnginfo=info)
        started = time.monotonic()
        job = client.submit(handle_file(str(path)), api_name="/paste_png")
        answers = 0
        for _ in range(300):  # poll /healthz while the paste is handled
            assert httpx.get(served + "healthz", timeout=30).status_code == 200
            answers += 1
            if job.done() or time.monotonic() - started > 30:
                break
            time.sleep(0.02)
        with pytest.raises(AppError):  # refused (no size, or a line over the cap): nothing filled in
            job.result(timeout=5)
        assert answers >= 1 and len(parsed) == (1 if chars == 16_000 else len(parsed[:1])), (name, parsed)
        assert all(cpu < 0.25 for cpu in parsed), f"{name}: parsing took {max(parsed):.2f} s of CPU"
