"""Editing with reference images: fitting, declared reference slots, parity with the plain pipeline."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

from neuron_backend.devices import CompileCounter, resolve_placements
from neuron_backend.errors import ConfigError, InvalidRequestError, ShapeNotReadyError
from neuron_backend.image.engine import ImageEngine, ImageRequest
from neuron_backend.image.references import (
    LETTERBOX_FILL,
    MAX_REFERENCE_PIXELS,
    MIN_REFERENCE_PIXELS,
    FittedReference,
    ReferenceImage,
    fit_reference,
    read_reference,
    reference_pixel_limit,
)
from neuron_backend.runtime import Backend
from neuron_backend.settings import FULL_PRESET, TINY_PRESET, parse_settings
from neuron_backend.shapes import EditSlot, ImageSize, reference_size, shape_keys
from neuron_backend.warmup import shape_title
from tools.demo_models import plugin as demo_builder

SIZES = (ImageSize(64, 64), ImageSize(96, 64))
MODEL_ID = "tiny/flux2-klein"


def photo(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    channels = len(mode)
    data = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(data if channels > 1 else data[..., 0], mode)


def png_bytes(image: Image.Image, kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, kind)
    return out.getvalue()


def make_engine(settings, demo_models) -> ImageEngine:
    engine = ImageEngine(settings, resolve_placements(settings)["image"], MODEL_ID)
    engine.load(demo_models.image)
    return engine


@pytest.fixture(scope="module")
def edit_engine(demo_models, tmp_path_factory):
    """One loaded eager engine serving 0, 1 or 2 references at SIZES."""
    cache = tmp_path_factory.mktemp("image-edit")
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(cache),
                               "--references", "0,1,2"], env={})
    return make_engine(settings.replace(sizes=SIZES, max_steps=4), demo_models)


# -- settings and shapes ------------------------------------------------------------------------


def test_default_settings_offer_one_reference_per_size():
    for models in ("tiny", "full"):
        settings = parse_settings(["--models", models], env={})
        assert settings.references == (0, 1)
        keys = shape_keys(settings, "image")
        assert keys[:len(settings.sizes)] == list(settings.sizes)  # text-to-image first, as before
        assert keys[len(settings.sizes):] == [EditSlot(size, 1) for size in settings.sizes]
    assert [k.label for k in shape_keys(parse_settings(["--models", "tiny", "--references", "0,2,1"], env={}),
                                        "image")][3:] == [
        "256x256+1ref", "336x192+1ref", "192x336+1ref", "256x256+2ref", "336x192+2ref", "192x336+2ref"]


@pytest.mark.parametrize(("value", "fragment"), [("1,2", "0 (text-to-image) is missing"), ("0,5", "5 is out of range"),
                                                 ("0,x", "not a whole number"), (",", "no count given")])
def test_bad_reference_counts_are_refused_at_start(value, fragment):
    with pytest.raises(ConfigError, match="--references") as caught:
        parse_settings(["--models", "tiny", "--references", value], env={})
    assert fragment in str(caught.value)


def test_a_size_that_cannot_take_references():
    with pytest.raises(ConfigError, match="size 48x48 cannot take references"):
        parse_settings(["--models", "tiny", "--sizes", "48x48", "--references", "0,1"], env={})
    # Not asked for: the preset's references are left out, text-to-image serves as before.
    assert parse_settings(["--models", "tiny", "--sizes", "48x48"], env={}).references == (0,)


def test_edit_slots_have_titles():
    assert str(shape_title(EditSlot(ImageSize(64, 64), 1), False)) == "size 64x64 + 1 reference"
    assert str(shape_title(EditSlot(ImageSize(64, 64), 2), False)) == "size 64x64 + 2 references"


# -- fitting --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [*FULL_PRESET.sizes, *TINY_PRESET.sizes, *SIZES, ImageSize(2048, 2048),
                                  ImageSize(2048, 1152)])
def test_the_pipeline_keeps_our_fitted_reference_unchanged(size):
    from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor

    target = reference_size(size)
    assert target.width * target.height <= 1024 * 1024 and not target.width % 16 and not target.height % 16
    assert target == size or size.width * size.height > 1024 * 1024
    fitted = fit_reference(ReferenceImage(photo(300, 170), "crop"), target).image
    # What Flux2KleinPipeline.__call__ does to each reference (diffusers 0.42), step by step.
    processor = Flux2ImageProcessor(vae_scale_factor=16)
    processor.check_image_input(fitted)
    width, height = fitted.size
    assert width * height <= 1024 * 1024  # no _resize_to_target_area
    assert (width // 16 * 16, height // 16 * 16) == (width, height)
    tensor = processor.preprocess(fitted, height=height, width=width, resize_mode="crop")
    plain = torch.from_numpy(np.asarray(fitted, dtype=np.float32) / 255.0).permute(2, 0, 1)[None] * 2 - 1
    assert torch.equal(tensor, plain)


def test_letterbox_keeps_the_whole_image_on_a_fixed_fill():
    wide = Image.new("RGB", (200, 100), (200, 30, 40))
    fitted = fit_reference(ReferenceImage(wide, "letterbox"), ImageSize(64, 64))
    pixels = np.asarray(fitted.image)
    assert fitted.image.size == (64, 64) and fitted.fitted == ImageSize(64, 64) and fitted.original == (200, 100)
    assert (pixels[:16] == LETTERBOX_FILL).all() and (pixels[48:] == LETTERBOX_FILL).all()  # 32 rows of image
    assert (pixels[20:44] == (200, 30, 40)).all()


def test_crop_covers_and_centres():
    halves = Image.new("RGB", (300, 100), (0, 0, 255))
    halves.paste((255, 0, 0), (100, 0, 200, 100))  # the middle third red
    fitted = fit_reference(ReferenceImage(halves, "crop"), ImageSize(64, 64)).image
    assert fitted.size == (64, 64)
    assert (np.asarray(fitted)[:, 4:60] == (255, 0, 0)).all()  # the centre square only


def test_fitting_is_deterministic_and_flattens_transparency():
    source = photo(123, 77, seed=3, mode="RGBA")
    one = fit_reference(ReferenceImage(source, "letterbox"), ImageSize(96, 64))
    two = fit_reference(ReferenceImage(source.copy(), "letterbox"), ImageSize(96, 64))
    assert one.image.mode == "RGB" and np.array_equal(np.asarray(one.image), np.asarray(two.image))
    assert one.sha256 == two.sha256 and len(one.sha256) == 64
    clear = Image.new("RGBA", (64, 64), (255, 255, 255, 0))
    assert (np.asarray(fit_reference(ReferenceImage(clear), ImageSize(64, 64)).image) == LETTERBOX_FILL).all()


@pytest.mark.slow
def test_read_reference_checks_the_file_before_decoding():
    data = png_bytes(photo(80, 60))
    reference = read_reference(data, "crop", "cat.png")
    assert reference.size == (80, 60) and reference.fit == "crop" and reference.name == "cat.png"
    import hashlib

    assert reference.sha256 == hashlib.sha256(data).hexdigest() and reference.data == data
    assert read_reference(png_bytes(photo(80, 60), "JPEG")).size == (80, 60)
    with pytest.raises(InvalidRequestError, match="is a GIF file; send PNG, JPEG, WEBP"):
        read_reference(png_bytes(photo(8, 8), "GIF"), name="a.gif")
    with pytest.raises(InvalidRequestError, match="is not an image that can be read"):
        read_reference(b"not an image", name="notes.txt")
    with pytest.raises(InvalidRequestError, match="Fit mode 'stretch' is not known: use letterbox, crop"):
        read_reference(data, "stretch")
    # Pixel bombs: many pixels in a few KB; refused from the header, before any pixel is decoded.
    bomb = io.BytesIO()
    Image.new("1", (9000, 9000)).save(bomb, "PNG")
    with pytest.raises(InvalidRequestError, match="'bomb.png' is 9000x9000 pixels; this server takes references "
                                                  r"of at most 67108864 pixels \(64.0 megapixels\)"):
        read_reference(bomb.getvalue(), name="bomb.png")
    Image.new("1", (20000, 20000)).save(bomb := io.BytesIO(), "PNG")  # over PIL's own limit too
    with pytest.raises(InvalidRequestError, match="'bomb.png' has far too many pixels; .* at most 67108864 pixels"):
        read_reference(bomb.getvalue(), name="bomb.png")


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` RGB pixels and whose data holds none (a few bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_the_reference_pixel_limit_comes_from_the_largest_declared_size():
    assert reference_pixel_limit([ImageSize(64, 64)]) == MIN_REFERENCE_PIXELS == 4 * 2**20
    assert reference_pixel_limit([ImageSize(512, 512), ImageSize(1024, 1024)]) == 16 * 1024 * 1024
    assert reference_pixel_limit([ImageSize(4096, 4096)]) == MAX_REFERENCE_PIXELS
    # 1 x 67,108,864 pixels in 70 bytes: under the old fixed 64-megapixel ceiling, far over 16 for 1024x1024.
    line = png_header(1, 67_108_864)
    assert len(line) < 100
    with pytest.raises(InvalidRequestError, match=r"'line.png' is 1x67108864 pixels; this server takes references "
                                                  r"of at most 16777216 pixels \(16.0 megapixels\)\. Send a smaller"):
        read_reference(line, name="line.png", limit=reference_pixel_limit([ImageSize(1024, 1024)]))


def test_references_are_decoded_only_inside_the_engine_one_at_a_time(edit_engine, monkeypatch):
    """Reading keeps the file's bytes; validate() decodes nothing; decoding happens while the request holds the
    engine, never two at once."""
    from PIL import ImageFile

    decodes, lock = [], __import__("threading").Lock()
    active = [0]
    real_load = ImageFile.ImageFile.load

    def counted_load(image):
        if image.size == (150, 90) and image.tile:  # a reference file of this test, not decoded yet
            with lock:
                active[0] += 1
                decodes.append((edit_engine.busy, active[0]))
            try:
                return real_load(image)
            finally:
                with lock:
                    active[0] -= 1
        return real_load(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counted_load)
    files = tuple(read_reference(png_bytes(photo(150, 90, seed)), "letterbox", f"{seed}.png") for seed in (1, 2))
    assert decodes == []  # read from the header only
    normal = edit_engine.validate(ImageRequest("fox", "96x64", references=files))
    assert decodes == [] and normal.references == files  # checked, still undecoded
    too_big = ImageRequest("fox", "64x64", references=(read_reference(png_header(2049, 2048), name="big.png"),))
    with pytest.raises(InvalidRequestError, match="at most 4194304 pixels"):  # 64x64 and 96x64: the 4 MP floor
        edit_engine.validate(too_big)
    from concurrent.futures import ThreadPoolExecutor

    request = ImageRequest("fox", "96x64", steps=1, seed=3, references=files)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: edit_engine.generate(request), range(3)))
    assert len(decodes) == 6 and all(busy and active == 1 for busy, active in decodes), decodes
    assert results[0].params["references"][0]["original_size"] == "150x90"
    assert all(np.array_equal(np.asarray(r.image), np.asarray(results[0].image)) for r in results)


# -- the engine -----------------------------------------------------------------------------------


def test_an_undeclared_count_is_refused_naming_the_allowed_ones(edit_engine):
    refs = tuple(ReferenceImage(photo(64, 64, seed)) for seed in range(3))
    allowed = r"3 reference images are not served here .* Allowed counts: 0, 1, 2\."
    with pytest.raises(InvalidRequestError, match=allowed):
        edit_engine.validate(ImageRequest("fox", "64x64", references=refs))
    with pytest.raises(InvalidRequestError, match="Fit mode 'fill' is not known"):
        edit_engine.validate(ImageRequest("fox", "64x64", references=(ReferenceImage(photo(64, 64), "fill"),)))
    with pytest.raises(InvalidRequestError, match="must be an image, not str"):
        edit_engine.validate(ImageRequest("fox", "64x64", references=("cat.png",)))
    normal = edit_engine.validate(ImageRequest("fox", "96x64", references=refs[:2]))
    assert all(isinstance(r, FittedReference) and r.image.size == (96, 64) for r in normal.references)
    assert edit_engine.shape_of(normal) == EditSlot(ImageSize(96, 64), 2)
    assert edit_engine.validate(normal) == normal  # a validated request passes again unchanged
    described = edit_engine.describe()["references"]
    assert described == {"counts": [0, 1, 2], "fit_modes": ["letterbox", "crop"],
                         "sizes": {"64x64": "64x64", "96x64": "96x64"}}


@pytest.mark.parity
def test_edit_and_text_to_image_equal_the_plain_pipeline_pixel_for_pixel(edit_engine, demo_models):
    from diffusers import Flux2KleinPipeline

    size, seed, steps = ImageSize(96, 64), 1234, 3
    sources = [ReferenceImage(photo(150, 90, 1), "letterbox", name="a.png"), ReferenceImage(photo(70, 110, 2), "crop")]
    result = edit_engine.generate(ImageRequest("make it blue", size, steps=steps, seed=seed,
                                               references=tuple(sources)))

    pipe = Flux2KleinPipeline.from_pretrained(demo_models.image)
    pipe.set_progress_bar_config(disable=True)
    fitted = [fit_reference(source, reference_size(size)).image for source in sources]
    plain = pipe(image=fitted, prompt="make it blue", height=size.height, width=size.width,
                 num_inference_steps=steps, guidance_scale=1.0, generator=torch.Generator().manual_seed(seed)).images[0]
    assert np.array_equal(np.asarray(result.image), np.asarray(plain))
    text_only = edit_engine.generate(ImageRequest("make it blue", size, steps=steps, seed=seed))
    assert not np.array_equal(np.asarray(result.image), np.asarray(text_only.image))  # the references count
    plain_text = pipe(prompt="make it blue", height=size.height, width=size.width, num_inference_steps=steps,
                      guidance_scale=1.0, generator=torch.Generator().manual_seed(seed)).images[0]
    assert np.array_equal(np.asarray(text_only.image), np.asarray(plain_text))  # the same engine, no reference
    assert "references" not in text_only.params
    assert result.params["references"] == [
        {"sha256": fit_reference(sources[0], size).sha256, "original_size": "150x90", "fitted_size": "96x64",
         "fit": "letterbox", "name": "a.png"},
        {"sha256": fit_reference(sources[1], size).sha256, "original_size": "70x110", "fitted_size": "96x64",
         "fit": "crop"},
    ]


@pytest.mark.slow
def test_warm_up_plan_has_one_task_per_slot(tmp_path, demo_models):
    from support.app import link_demo_models

    link_demo_models(tmp_path, demo_models)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-chat",
                               "--sizes", "64x64,96x64", "--references", "0,1,2"], env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))
    compiles = [t for t in backend.runner.snapshot()["tasks"] if t["kind"] == "compile"]
    assert [t["shape"] for t in compiles] == ["64x64", "96x64", "64x64+1ref", "96x64+1ref", "64x64+2ref",
                                              "96x64+2ref"]
    assert compiles[2]["name"] == "image · size 64x64 + 1 reference"
    backend.runner.run()
    states = backend.shape_states("image")
    assert {label: s["state"] for label, s in states.items()} == {t["shape"]: "ready" for t in compiles}
    engine = backend.engine("image")
    ref = (ReferenceImage(photo(64, 64)),)
    assert engine.generate(ImageRequest("fox", "64x64", steps=1, seed=1, references=ref)).image.size == (64, 64)


# -- compiled (inductor on CPU as the stand-in for the neuron backend) ----------------------


@pytest.mark.slow
def test_compiled_edit_slots_never_recompile_after_warm_up(tiny_settings, demo_models):
    cold_size = ImageSize(80, 64)  # declared, never warmed up: the proof that the stance is not vacuous
    settings = tiny_settings.replace(sizes=(*SIZES, cold_size), references=(0, 1, 2), compile="on", max_steps=2,
                                     default_steps=1)
    # Dynamo keeps graphs per code object across engines: a size that another test compiled earlier in this
    # process would compile nothing here. Start from empty caches, as a fresh server does.
    torch._dynamo.reset()
    engine = make_engine(settings, demo_models)
    assert engine.placement.compile and engine.placement.compile_backend == "inductor"
    engine.shapes.gated = True
    slots = [key for key in engine.shapes.keys() if cold_size not in (key, getattr(key, "size", None))]
    assert [slot.label for slot in slots] == ["64x64", "96x64", "64x64+1ref", "96x64+1ref", "64x64+2ref",
                                              "96x64+2ref"]
    for slot in slots:
        engine.warm_up(slot)
    per_slot = {label: info["compiled_graphs"] for label, info in engine.describe()["warmups"].items()}
    # One transformer graph per sequence length (output tokens + each reference's), the first slot that has it
    # compiles it: 96x64+1ref and 64x64+2ref are both 48 tokens (16 a 64x64 image, 24 a 96x64 one).
    tokens = {slot.label: (slot.size.width * slot.size.height // 256) * (1 + slot.references)
              if isinstance(slot, EditSlot) else slot.width * slot.height // 256 for slot in slots}
    assert tokens["96x64+1ref"] == tokens["64x64+2ref"] == 48
    first = {}
    for label, count in tokens.items():
        first.setdefault(count, label)
    assert per_slot == {label: int(first[count] == label) for label, count in tokens.items()}
    before = CompileCounter.graphs()
    seeds = random.Random(0)
    cold = (ReferenceImage(photo(64, 64)),)
    with torch.compiler.set_stance("fail_on_recompile"):
        for slot in slots:
            size, count = (slot.size, slot.references) if isinstance(slot, EditSlot) else (slot, 0)
            for fit in ("letterbox", "crop"):  # any source size, either fit: the same fitted shape
                refs = tuple(ReferenceImage(photo(50 + 30 * i, 90, i), fit) for i in range(count))
                for steps in (1, 2):
                    result = engine.generate(ImageRequest("fox", size, steps=steps, seed=seeds.randrange(2**32),
                                                          references=refs))
                    assert result.compiled_graphs == 0 and result.image.size == tuple(size)
        with pytest.raises(ShapeNotReadyError):  # the gate keeps a cold slot off the request path
            engine.generate(ImageRequest("fox", cold_size, steps=1, references=cold))
        engine.shapes.gated = False
        with pytest.raises(Exception, match="(?i)recompil"):  # and the stance would catch it: not vacuous
            engine.generate(ImageRequest("fox", cold_size, steps=1, references=cold))
    assert CompileCounter.graphs() == before
    print(f"\ncompiled graphs per slot: {per_slot}")


def test_an_edit_slot_still_warming_up_is_refused(tiny_settings, demo_models):
    engine = make_engine(tiny_settings.replace(sizes=SIZES, references=(0, 1)), demo_models)
    engine.shapes.gated = True
    engine.warm_up(ImageSize(64, 64))
    with pytest.raises(ShapeNotReadyError, match="64x64\\+1ref is still warming up"):
        engine.generate(ImageRequest("fox", "64x64", steps=1, references=(ReferenceImage(photo(64, 64)),)))


def test_memory_counts_the_reference_tokens(demo_models):
    from neuron_backend import memory

    sizes = [ImageSize(64, 64), ImageSize(2048, 2048)]
    plain = memory.estimate_image(demo_models.image, torch.float32, sizes, on_cpu=True)
    edit = memory.estimate_image(demo_models.image, torch.float32, sizes, on_cpu=True, references=2)
    assert plain.references == 0 and "reference" not in str(plain.text())
    width = memory.transformer_width(demo_models.image)
    assert width == 32  # the stand-in's 2 heads x 16
    tokens = 2 * (1024 // 16) ** 2  # two references at 2048x2048 are fitted to 1024x1024 each
    assert edit.reference_tokens == tokens and edit.references == memory.TOKEN_FACTOR * width * tokens * 4
    sequence = memory.TEXT_TOKENS + (2048 // 16) ** 2 + tokens  # the largest edit slot's joint sequence
    assert plain.attention == 0 and edit.attention == 2 * sequence**2 * 4  # the stand-in's 2 heads, float32
    assert edit.total == plain.total + edit.references + edit.attention
    assert f"{tokens} reference tokens" in str(edit.text())
    with pytest.raises(memory.NotEnoughMemory, match="fewer --references"):
        memory.plan_image(demo_models.image, torch.float32, "float32", sizes, "cpu", plain.total, references=2)
    assert memory.plan_image(demo_models.image, torch.float32, "float32", sizes, "cpu", plain.total).dtype \
        == torch.float32


def test_warm_up_refuses_an_undeclared_slot(edit_engine):
    with pytest.raises(InvalidRequestError, match="3 reference images are not served here"):
        edit_engine.warm_up(EditSlot(ImageSize(64, 64), 3))
