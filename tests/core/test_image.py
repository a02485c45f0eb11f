"""The image engine on the tiny random-weight Flux2KleinPipeline, on the CPU (eager and inductor)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from support.model_folders import non_distilled_copy

from neuron_backend.devices import CompileCounter, resolve_placements
from neuron_backend.errors import (
    EngineUnavailableError,
    InvalidRequestError,
    ShapeFailedError,
    ShapeNotReadyError,
    UnsupportedSizeError,
)
from neuron_backend.image.engine import MAX_SEQUENCE_LENGTH, ImageEngine, ImageRequest, read_png_parameters
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import ImageSize

# Smaller than the tiny preset: each eager step takes milliseconds, each inductor compile seconds.
SIZES = (ImageSize(64, 64), ImageSize(96, 64), ImageSize(64, 96))
ALLOWED = "64x64, 96x64, 64x96"
MODEL_ID = "tiny/flux2-klein"


def make_engine(settings, demo_models, load=True) -> ImageEngine:
    engine = ImageEngine(settings, resolve_placements(settings)["image"], MODEL_ID)
    if load:
        engine.load(demo_models.image)
    return engine


def pixels(result) -> np.ndarray:
    return np.asarray(result.image)


@pytest.fixture
def settings(tiny_settings):
    return tiny_settings.replace(sizes=SIZES, max_steps=6)


@pytest.fixture
def engine(settings, demo_models):
    return make_engine(settings, demo_models)


@pytest.fixture(scope="module")
def shared_engine(demo_models, tmp_path_factory):
    """One loaded engine for the tests that only validate or generate (not compile, not mutate)."""
    cache = tmp_path_factory.mktemp("image-shared")
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(cache)], env={})
    return make_engine(settings.replace(sizes=SIZES, max_steps=6), demo_models)


# -- validation ---------------------------------------------------------------------------

BAD_REQUESTS = [
    # (field changes, error type, fragment of the message)
    ({"prompt": ""}, InvalidRequestError, "empty"),
    ({"prompt": " \n\t "}, InvalidRequestError, "empty"),
    ({"prompt": "\x00\x07\x1b"}, InvalidRequestError, "empty"),
    ({"prompt": "x" * 20_001}, InvalidRequestError, "limit is 20000"),
    ({"prompt": None}, InvalidRequestError, "must be text"),
    ({"size": "1024"}, UnsupportedSizeError, "malformed"),
    ({"size": "0x0"}, UnsupportedSizeError, "multiples of 16"),
    ({"size": "-1x5"}, UnsupportedSizeError, "malformed"),
    ({"size": "1024x1024x3"}, UnsupportedSizeError, "malformed"),
    ({"size": "72x64"}, UnsupportedSizeError, "multiples of 16"),  # the pipeline would round it to 64x64
    ({"size": "256x256"}, UnsupportedSizeError, "not served here"),  # valid, but not a configured size
    ({"size": ""}, UnsupportedSizeError, "malformed"),
    ({"size": None}, UnsupportedSizeError, "malformed"),
    ({"steps": 0}, InvalidRequestError, "out of range"),
    ({"steps": 7}, InvalidRequestError, "from 1 to 6"),
    ({"steps": -1}, InvalidRequestError, "out of range"),
    ({"steps": True}, InvalidRequestError, "whole number"),
    ({"steps": 2.0}, InvalidRequestError, "whole number"),
    ({"steps": "4"}, InvalidRequestError, "whole number"),
    ({"seed": -1}, InvalidRequestError, "out of range"),
    ({"seed": 2**32}, InvalidRequestError, "from 0 to 4294967295"),
    ({"seed": False}, InvalidRequestError, "whole number"),
    ({"seed": 1.5}, InvalidRequestError, "whole number"),
    ({"seed": "42"}, InvalidRequestError, "whole number"),
    ({"guidance": "3"}, InvalidRequestError, "must be a number"),
    ({"guidance": True}, InvalidRequestError, "must be a number"),
    ({"guidance": float("nan")}, InvalidRequestError, "must be a number"),
    ({"guidance": 0.5}, InvalidRequestError, "out of range"),
    ({"guidance": 25.0}, InvalidRequestError, "out of range"),
]


@pytest.mark.parametrize(("changes", "error", "fragment"), BAD_REQUESTS, ids=lambda v: repr(v)[:40])
def test_invalid_requests_are_refused_with_a_clear_message(shared_engine, changes, error, fragment):
    fields = {"prompt": "a red fox", "size": "64x64", "steps": 2, "seed": 1, "guidance": None, **changes}
    request = ImageRequest(**fields)
    for call in (shared_engine.validate, shared_engine.generate):
        with pytest.raises(error) as caught:
            call(request)
        assert fragment in str(caught.value)
        if error is UnsupportedSizeError:
            assert f"Allowed sizes: {ALLOWED}." in str(caught.value)


def test_validate_normalises(shared_engine):
    request = ImageRequest("\x00 a red\x07 fox\r\non snow\t \x1b", " 96X64 ", seed=2**32 - 1, guidance=3.0)
    normal = shared_engine.validate(request)
    assert normal.prompt == "a red fox\non snow"
    assert normal.size == ImageSize(96, 64) and isinstance(normal.size, ImageSize)
    assert normal.steps == shared_engine.settings.default_steps
    assert normal.seed == 2**32 - 1
    assert normal.guidance is None  # the demo pipeline is distilled, like FLUX.2-klein
    assert shared_engine.validate(ImageRequest("fox", ImageSize(64, 96))).size == ImageSize(64, 96)


def test_warm_up_refuses_an_unconfigured_size(shared_engine):
    with pytest.raises(UnsupportedSizeError, match=ALLOWED):
        shared_engine.warm_up(ImageSize(128, 128))


def test_not_loaded_engine_is_unavailable(settings, demo_models):
    engine = make_engine(settings, demo_models, load=False)
    assert engine.describe()["loaded"] is False and engine.describe()["distilled"] is None
    with pytest.raises(EngineUnavailableError, match="not loaded"):
        engine.generate(ImageRequest("fox", "64x64"))
    with pytest.raises(EngineUnavailableError, match="model_index.json: missing"):  # checked before loading
        engine.load(settings.cache_dir / "no-such-model")
    assert engine.cancel() is False


# -- generation ---------------------------------------------------------------------------


def test_same_seed_same_pixels_other_seed_other_pixels(shared_engine):
    request = ImageRequest("a lighthouse at dusk", "96x64", steps=2, seed=7)
    first, again = shared_engine.generate(request), shared_engine.generate(request)
    assert first.seed == again.seed == 7
    assert first.image.size == (96, 64)
    assert np.array_equal(pixels(first), pixels(again))
    other = shared_engine.generate(ImageRequest("a lighthouse at dusk", "96x64", steps=2, seed=8))
    assert not np.array_equal(pixels(first), pixels(other))
    drawn = shared_engine.generate(ImageRequest("a lighthouse at dusk", "96x64", steps=2))  # random seed
    assert 0 <= drawn.seed < 2**32 and drawn.params["seed"] == drawn.seed
    replay = shared_engine.generate(ImageRequest("a lighthouse at dusk", "96x64", steps=2, seed=drawn.seed))
    assert np.array_equal(pixels(drawn), pixels(replay))


def test_progress_is_called_once_per_step(shared_engine):
    calls = []
    result = shared_engine.generate(ImageRequest("fox", "64x64", steps=4, seed=3), progress=lambda *a: calls.append(a))
    assert [(step, total) for step, total, _ in calls] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    elapsed = [e for _, _, e in calls]
    assert all(e >= 0 for e in elapsed) and elapsed == sorted(elapsed) and elapsed[-1] <= result.seconds
    assert not result.stopped and result.params["steps_done"] == 4 and result.compiled_graphs == 0


def test_cancel_from_progress_stops_after_that_step(engine):
    calls = []

    def progress(step, total, elapsed):
        calls.append(step)
        if step == 2:
            assert engine.cancel() is True

    result = engine.generate(ImageRequest("fox", "64x64", steps=6, seed=1), progress=progress)
    assert result.stopped and calls == [1, 2]
    assert result.params["stopped"] is True and result.params["steps_done"] == 2 and result.params["steps"] == 6
    assert result.image.size == (64, 64) and result.path is not None  # the partial image is still decoded
    assert engine.cancel() is False  # nothing runs now
    after = engine.generate(ImageRequest("fox", "64x64", steps=3, seed=1))  # the engine is free again
    assert not after.stopped and after.params["steps_done"] == 3


def test_cancel_from_another_thread(engine):
    at_step_one, results = threading.Event(), []

    def progress(step, total, elapsed):
        at_step_one.set()
        time.sleep(0.05)  # keep the job running while the main thread cancels

    worker = threading.Thread(
        target=lambda: results.append(engine.generate(ImageRequest("fox", "64x64", steps=6, seed=1), progress)),
    )
    worker.start()
    assert at_step_one.wait(30)
    assert engine.cancel() is True
    worker.join(30)
    assert results and results[0].stopped and results[0].params["steps_done"] < 6


def test_png_carries_infotext_and_json(shared_engine):
    prompt = "un café ☕ sous la pluie, 猫"  # not latin-1: stored as an iTXt chunk
    result = shared_engine.generate(ImageRequest(prompt, "96x64", steps=3, seed=11, guidance=5.0))
    assert result.path is not None and result.path.parent == shared_engine.settings.cache_dir / "outputs"
    with Image.open(result.path) as png:
        assert png.format == "PNG" and png.size == (96, 64)
        infotext = png.text["parameters"]
        assert np.array_equal(np.asarray(png.convert("RGB")), pixels(result))
    assert infotext.startswith(prompt + "\n")
    for fragment in ("Steps: 3", "Sampler: FlowMatchEuler", "Seed: 11", "Size: 96x64", f"Model: {MODEL_ID}"):
        assert fragment in infotext
    assert "CFG scale" not in infotext  # distilled: guidance is not used
    assert read_png_parameters(result.path) == result.params
    params = result.params
    assert params["prompt"] == prompt and params["seed"] == 11 and params["steps"] == 3
    assert (params["size"], params["width"], params["height"]) == ("96x64", 96, 64)
    assert params["guidance"] is None and "ignored" in params["guidance_note"]
    assert params["model"] == MODEL_ID and params["device"] == "cpu" and params["dtype"] == "float32"
    assert params["mode"] == "eager" and params["compiled"] is False
    assert set(params["versions"]) == {"torch", "diffusers", "transformers"}
    assert params["prompt_truncated"] is False and params["seconds"] > 0


def test_read_png_parameters_falls_back_to_infotext(tmp_path):
    info = PngInfo()
    info.add_text("parameters", 'a cat, on a mat\nSteps: 4, Sampler: FlowMatchEuler, Seed: 42, Model: "a, b"')
    Image.new("RGB", (16, 16)).save(tmp_path / "a1111.png", pnginfo=info)
    parsed = read_png_parameters(tmp_path / "a1111.png")
    assert parsed == {
        "prompt": "a cat, on a mat",
        "Steps": "4",
        "Sampler": "FlowMatchEuler",
        "Seed": "42",
        "Model": "a, b",
    }
    Image.new("RGB", (16, 16)).save(tmp_path / "plain.png")
    assert read_png_parameters(tmp_path / "plain.png") == {}


def test_long_prompt_is_truncated_and_says_so(shared_engine):
    long_prompt = "a very long prompt " * 40  # byte-level demo tokenizer: > 512 tokens
    result = shared_engine.generate(ImageRequest(long_prompt, "64x64", steps=1, seed=1))
    assert result.prompt_truncated and result.params["prompt_truncated"]
    assert result.params["prompt_tokens"] > MAX_SEQUENCE_LENGTH
    assert "Prompt truncated: to 512 tokens" in Image.open(result.path).text["parameters"]
    short = shared_engine.generate(ImageRequest("a short prompt", "64x64", steps=1, seed=1))
    assert not short.prompt_truncated and short.params["prompt_tokens"] < 64


def test_guidance_is_used_when_the_model_is_not_distilled(settings, demo_models, tmp_path):
    engine = make_engine(settings, SimpleNamespace(image=non_distilled_copy(demo_models.image, tmp_path / "base")))
    assert engine.distilled is False  # as FLUX.2-klein-base loads
    assert engine.validate(ImageRequest("fox", "64x64")).guidance == 4.0
    result = engine.generate(ImageRequest("fox", "64x64", steps=2, seed=1, guidance=2.5))
    assert result.params["guidance"] == 2.5 and "guidance_note" not in result.params
    assert "CFG scale: 2.5" in Image.open(result.path).text["parameters"]


@pytest.mark.slow
def test_output_folder_keeps_the_newest_images(settings, demo_models):
    engine = make_engine(settings.replace(max_saved_images=3), demo_models)
    paths = [engine.generate(ImageRequest("fox", "64x64", steps=1, seed=s)).path for s in range(5)]
    saved = sorted((settings.cache_dir / "outputs").iterdir())
    assert len(saved) == 3 and saved == sorted(paths[2:])
    assert [p.name for p in engine.outputs.saved_files()] == [p.name for p in paths[2:]]


def test_unwritable_output_folder_still_returns_the_image(settings, demo_models):
    (settings.cache_dir / "outputs").write_text("a file where the folder should be")
    engine = make_engine(settings, demo_models)
    result = engine.generate(ImageRequest("fox", "64x64", steps=1, seed=1))
    assert result.path is None and result.image.size == (64, 64)
    assert result.params["save_note"].startswith("not saved: could not write to")
    disabled = make_engine(settings.replace(max_saved_images=0), demo_models)
    result = disabled.generate(ImageRequest("fox", "64x64", steps=1, seed=1))
    assert result.path is None and "max-saved-images is 0" in result.params["save_note"]


def test_a_failing_size_is_isolated(engine, monkeypatch):
    transformer = engine._pipe.transformer
    real_forward = transformer.forward

    def forward(*args, img_ids, **kwargs):
        # img_ids: [B, H*W, 4] of (t, row, column, layer); the last token of 96x64 is row 3, column 5.
        if img_ids[0, -1, 1:3].tolist() == [64 // 16 - 1, 96 // 16 - 1]:
            raise RuntimeError("simulated compiler crash\nwith a long log")
        return real_forward(*args, img_ids=img_ids, **kwargs)

    monkeypatch.setattr(transformer, "forward", forward)
    engine.shapes.gated = True  # as the warm-up runner does: not-yet-ready sizes are refused
    engine.warm_up(ImageSize(64, 64))
    with pytest.raises(RuntimeError, match="simulated"):
        engine.warm_up(ImageSize(96, 64))
    assert engine.shapes.snapshot() == {
        "64x64": {"state": "ready", "reason": None},
        "96x64": {"state": "failed", "reason": "RuntimeError: simulated compiler crash"},
        "64x96": {"state": "pending", "reason": None},
    }
    with pytest.raises(ShapeFailedError, match="96x64 is unavailable: its warm-up failed .*simulated compiler crash"):
        engine.generate(ImageRequest("fox", "96x64", steps=1))
    with pytest.raises(ShapeNotReadyError, match="64x96 is still warming up"):
        engine.generate(ImageRequest("fox", "64x96", steps=1))
    assert engine.generate(ImageRequest("fox", "64x64", steps=2, seed=1)).image.size == (64, 64)
    engine.warm_up(ImageSize(64, 96))
    assert engine.generate(ImageRequest("fox", "64x96", steps=1, seed=1)).image.size == (64, 96)
    assert set(engine.describe()["warmups"]) == {"64x64", "64x96"}


@pytest.mark.slow
def test_concurrent_callers_run_one_at_a_time(shared_engine):
    log, results, errors = [], {}, []

    def call(seed):
        try:
            request = ImageRequest("a boat", "64x64", steps=3, seed=seed)
            results[seed] = shared_engine.generate(request, lambda step, total, e: log.append((seed, step)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(seed,)) for seed in (21, 22, 23)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and sorted(results) == [21, 22, 23]
    # Each job's steps are contiguous: no job ran inside another.
    order = [seed for seed, _ in log]
    assert len(log) == 9 and all(order[i] == order[i - (i % 3)] for i in range(9))
    for seed, result in results.items():  # and none disturbed another's random stream
        alone = shared_engine.generate(ImageRequest("a boat", "64x64", steps=3, seed=seed))
        assert np.array_equal(pixels(result), pixels(alone))
    assert len({r.path for r in results.values()}) == 3


def test_describe_is_plain_data(shared_engine):
    info = shared_engine.describe()
    assert info["name"] == "image" and info["model"] == MODEL_ID and info["loaded"] and info["distilled"]
    assert info["sizes"] == ["64x64", "96x64", "64x96"] and info["mode"] == "eager"
    assert info["guidance"]["used"] is False and info["steps"] == {"default": 4, "max": 6}


@pytest.mark.slow
def test_backend_import_does_not_import_gradio():
    code = "import sys, neuron_backend.image.engine; assert 'gradio' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- compiled (inductor on CPU as the stand-in for the neuron backend) ----------------------


@pytest.mark.slow
@pytest.mark.parametrize("repeated_blocks", ["off", "on"], ids=["whole-transformer", "repeated-blocks"])
def test_compiled_sizes_never_recompile_after_warm_up(tiny_settings, demo_models, repeated_blocks):
    # 96x64 and 64x96 have the same token count, so the same transformer graph: the cold size differs.
    warm, cold = SIZES[:2], ImageSize(80, 64)
    settings = tiny_settings.replace(
        sizes=(*warm, cold), compile="on", compile_repeated_blocks=repeated_blocks, max_steps=3, default_steps=2
    )
    # Dynamo keeps graphs per code object across engines: a size that another test compiled earlier in this
    # process (test_image_edit.py's) would compile nothing here. Start from empty caches, as a fresh server does.
    torch._dynamo.reset()
    engine = make_engine(settings, demo_models)
    assert engine.placement.compile and engine.placement.compile_backend == "inductor"
    engine.shapes.gated = True
    for size in warm:
        engine.warm_up(size)
    per_size = {label: info["compiled_graphs"] for label, info in engine.describe()["warmups"].items()}
    # one graph per size (whole transformer) or one per block class and size (repeated blocks)
    assert per_size == {size.label: 2 if repeated_blocks == "on" else 1 for size in warm}
    before = CompileCounter.graphs()
    seeds = random.Random(0)
    with torch.compiler.set_stance("fail_on_recompile"):
        for size in warm:
            for steps in range(1, settings.max_steps + 1):
                result = engine.generate(ImageRequest("fox", size, steps=steps, seed=seeds.randrange(2**32)))
                assert result.compiled_graphs == 0 and result.params["mode"].startswith("compiled (inductor")
        with pytest.raises(ShapeNotReadyError):  # the gate keeps a cold size off the request path
            engine.generate(ImageRequest("fox", cold, steps=1))
        engine.shapes.gated = False
        with pytest.raises(Exception, match="(?i)recompil"):  # and the stance would catch it: not vacuous
            engine.generate(ImageRequest("fox", cold, steps=1))
    assert CompileCounter.graphs() == before
    warmups = engine.describe()["warmups"]
    print(
        f"\ncompiled graphs per size ({'repeated blocks' if repeated_blocks == 'on' else 'whole'}): {per_size}; "
        f"warm-up seconds: { {k: v['seconds'] for k, v in warmups.items()} }"
    )
