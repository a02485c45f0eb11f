"""The image wing: live preview, several images per run, stop and cancel (paste-back:
tests/tools/test_paste_back.py).

Real tiny pipeline on the CPU; the API tests run the app in-process (tests/support/app.py).
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import torch
from gradio_client import Client
from PIL import Image
from support.app import start_app
from support.model_folders import with_one_level_vae

from neuron_backend.devices import CompileCounter, resolve_placements
from neuron_backend.errors import CancelledError, InvalidRequestError
from neuron_backend.image.engine import ImageEngine, ImageRequest, read_png_parameters
from neuron_backend.image.preview import TABLE_FILE, LatentRGB, cached_or_fitted, fit_latent_rgb, read_table, unpack
from neuron_backend.shapes import ImageSize

SIZES = (ImageSize(64, 64), ImageSize(96, 64))


@pytest.fixture
def settings(tiny_settings):
    return tiny_settings.replace(sizes=SIZES, max_steps=60)


def make_engine(settings, demo_models) -> ImageEngine:
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "tiny/flux2-klein")
    engine.load(demo_models.image)
    return engine


@pytest.fixture
def engine(settings, demo_models):
    return make_engine(settings, demo_models)


# -- the latents -> RGB table ---------------------------------------------------------------

def test_demo_model_ships_a_fitted_table_that_beats_a_flat_colour(demo_models):
    table = read_table(demo_models.image / TABLE_FILE)
    assert table is not None and table.channels == 4 and "least squares" in table.note
    import diffusers

    vae = diffusers.AutoencoderKLFlux2.from_pretrained(demo_models.image, subfolder="vae")
    # Held-out latents (another seed than the fit): the table predicts the decoded, pooled colours
    # better than its bias alone would.
    fresh = fit_latent_rgb(vae, samples=2, seed=7)
    generator = torch.Generator().manual_seed(123)
    patched = torch.randn(1, 16, 8, 8, generator=generator)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    packed = patched.flatten(2).transpose(1, 2)
    with torch.no_grad():
        decoded = vae.decode(unpack((patched * std + mean).flatten(2).transpose(1, 2), 128, 128)).sample
    target = torch.nn.functional.avg_pool2d(decoded, 8)[0].permute(1, 2, 0).clamp(-1, 1)
    predicted = torch.from_numpy(np.asarray(table.render(packed, 128, 128), dtype=np.float32)) / 127.5 - 1
    flat = torch.tensor(table.bias).clamp(-1, 1).expand_as(target)
    assert ((predicted - target) ** 2).mean() < ((flat - target) ** 2).mean()
    assert fresh.channels == table.channels


@pytest.mark.parity
def test_unpack_matches_the_pipelines_own_unpacking(demo_models):
    from diffusers import Flux2KleinPipeline

    packed = torch.randn(2, 4 * 6, 16)  # 96x64: 6x4 tokens of 4*4 channels
    ids = Flux2KleinPipeline._prepare_latent_ids(torch.zeros(2, 16, 4, 6))
    expected = Flux2KleinPipeline._unpatchify_latents(Flux2KleinPipeline._unpack_latents_with_ids(packed, ids, 4, 6))
    assert torch.equal(unpack(packed, 96, 64), expected)


def test_a_model_without_a_table_gets_one_fitted_once_and_cached(tmp_path, demo_models):
    import diffusers

    vae = diffusers.AutoencoderKLFlux2.from_pretrained(demo_models.image, subfolder="vae")
    folder = tmp_path / "model"
    folder.mkdir()
    first = cached_or_fitted(folder, vae, tmp_path / "cache")
    cached = list((tmp_path / "cache" / "preview").glob("*.json"))
    assert first is not None and len(cached) == 1
    assert cached_or_fitted(folder, vae, tmp_path / "cache") == first
    assert LatentRGB.from_json(first.to_json()) == first


@pytest.mark.slow
def test_a_one_level_vae_gets_a_preview_at_its_own_scale(tmp_path, settings, demo_models, monkeypatch):
    # vae_scale_factor 1: one latent pixel per image pixel (FLUX.2's four-level VAE: 8x8 pixels)
    from neuron_backend.image import engine as image_engine

    monkeypatch.setattr(image_engine, "PREVIEW_INTERVAL_S", 0.0)
    folder = with_one_level_vae(demo_models.image, tmp_path / "one-level")
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "tiny/one-level-vae")
    engine.load(folder)
    table = engine.preview_table
    assert table is not None and table.scale == 1 and "1x1-pooled" in table.note
    assert LatentRGB.from_json(table.to_json()) == table
    frames = []
    result = engine.generate(ImageRequest("fox", "96x64", steps=3, seed=3), preview=frames.append)
    assert [f.step for f in frames] == [1, 2] and frames[0].image().size == (96, 64) == result.image.size


# -- preview frames, several images ------------------------------------------------------------

@pytest.mark.slow
def test_preview_frames_arrive_during_denoising_and_the_flag_turns_them_off(settings, demo_models, monkeypatch):
    from neuron_backend.image import engine as image_engine

    monkeypatch.setattr(image_engine, "PREVIEW_INTERVAL_S", 0.0)  # every step, to count them
    frames = []
    engine = make_engine(settings, demo_models)
    result = engine.generate(ImageRequest("fox", "96x64", steps=8, seed=3), preview=frames.append)
    assert [f.step for f in frames] == list(range(1, 8))  # every step but the last (the final image follows)
    assert frames[0].image().size == (12, 8) and frames[0].latents.device.type == "cpu"
    assert result.compiled_graphs == 0
    plain = make_engine(settings.replace(image_preview=False), demo_models)
    frames.clear()
    same = plain.generate(ImageRequest("fox", "96x64", steps=8, seed=3), preview=frames.append)
    assert frames == [] and plain.preview_table is None
    assert np.array_equal(np.asarray(same.image), np.asarray(result.image))  # a preview changes nothing


def test_several_images_have_consecutive_seeds_and_each_its_own_png(engine):
    results = engine.generate_run(ImageRequest("a fox", "64x64", steps=2, seed=41, count=3))
    assert [r.seed for r in results] == [41, 42, 43]
    assert len({r.path for r in results}) == 3
    for index, result in enumerate(results):
        saved = read_png_parameters(result.path)
        assert saved["seed"] == result.seed and saved["run_image"] == index + 1 and saved["run_images"] == 3
    alone = engine.generate(ImageRequest("a fox", "64x64", steps=2, seed=42))
    assert np.array_equal(np.asarray(alone.image), np.asarray(results[1].image))  # each one reproducible alone
    with pytest.raises(InvalidRequestError, match="Images per run .* 1 to 4"):
        engine.validate(ImageRequest("a fox", "64x64", count=5))


# -- stop and cancel --------------------------------------------------------------------------

@pytest.mark.parametrize("stop_at", sorted(random.Random(5).sample(range(1, 59), 4)))
def test_stop_takes_effect_at_the_next_step_boundary(engine, stop_at):
    cancel = threading.Event()

    def progress(step, total, elapsed):
        if step == stop_at:
            cancel.set()  # the server received the stop during this step

    result = engine.generate(ImageRequest("fox", "64x64", steps=60, seed=1), progress, cancel)
    assert result.stopped and result.params["steps_done"] == stop_at
    assert "Stopped at step" in Image.open(result.path).text["parameters"]


def test_stop_in_a_several_image_run_keeps_the_finished_images_and_starts_no_more(engine):
    cancel = threading.Event()
    results = engine.generate_run(ImageRequest("fox", "64x64", steps=10, seed=1, count=4),
                                  lambda step, total, _: step == 13 and cancel.set(), cancel)
    assert [(r.seed, r.stopped, r.params["steps_done"]) for r in results] == [(1, False, 10), (2, True, 3)]


def test_a_request_cancelled_while_it_waits_is_dropped_unrun_and_unsaved(engine):
    started, release = threading.Event(), threading.Event()
    holder_cancel = threading.Event()

    def hold(step, total, elapsed):
        started.set()
        release.wait(10)

    holder = threading.Thread(target=engine.generate,
                              args=(ImageRequest("holder", "64x64", steps=5, seed=1), hold, holder_cancel))
    holder.start()
    assert started.wait(10)
    waiting_cancel, outcome, steps_run = threading.Event(), {}, []

    def waiting():
        try:
            engine.generate(ImageRequest("waiter", "64x64", steps=5, seed=2),
                            lambda *a: steps_run.append(a), waiting_cancel)
        except CancelledError as exc:
            outcome["error"] = str(exc)

    saved_before = len(engine.outputs.saved_files())
    waiter = threading.Thread(target=waiting)
    waiter.start()
    waiting_cancel.set()  # stopped while queued behind the holder
    holder_cancel.set()
    release.set()
    holder.join(10)
    waiter.join(10)
    assert "Stopped before it started" in outcome["error"] and steps_run == []
    assert len(engine.outputs.saved_files()) == saved_before + 1  # only the holder's image
    with pytest.raises(CancelledError):  # and one cancelled before it was even submitted
        engine.generate(ImageRequest("x", "64x64", steps=3), cancel=waiting_cancel)


# -- through the API ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("image-wing")
    demo, backend, url = start_app(root, "--max-steps", "400")
    yield backend, Client(url, verbose=False), url
    demo.close()


@pytest.mark.slow
def test_api_several_images_and_preview_frames(served):
    backend, client, url = served
    job = client.submit(prompt="a fox", size="96x64", steps=60, seed=5, images=2, preview=True,
                        api_name="/generate_image")
    pngs, params = job.result(timeout=120)
    assert [p["seed"] for p in params] == [5, 6] and len(pngs) == 2
    assert [read_png_parameters(p)["seed"] for p in pngs] == [5, 6]
    updates = [o[1] for o in job.outputs() if isinstance(o, (list, tuple)) and isinstance(o[1], dict)]
    frames = [u for u in updates if "preview" in u]
    assert frames and frames[0]["preview"].startswith("data:image/png;base64,")
    plain = client.submit(prompt="a fox", size="64x64", steps=30, seed=5, api_name="/generate_image")
    png, one = plain.result(timeout=120)
    assert isinstance(png, str) and one["seed"] == 5  # one image: the same contract as before
    assert not any("preview" in o[1] for o in plain.outputs() if isinstance(o, (list, tuple)) and o[1])


@pytest.mark.slow
def test_api_cancel_while_waiting_for_the_engine_runs_no_step_and_saves_nothing(served):
    backend, client, url = served
    engine = backend.engine("image")
    started, release, holder_cancel = threading.Event(), threading.Event(), threading.Event()

    def hold(step, total, elapsed):
        started.set()
        release.wait(10)

    holder = threading.Thread(target=engine.generate, args=(ImageRequest("holder", "64x64", steps=3, seed=1), hold,
                                                             holder_cancel))
    holder.start()
    assert started.wait(10)
    before = len(engine.outputs.saved_files())
    job = client.submit(prompt="queued", size="96x64", steps=400, seed=2, api_name="/generate_image")
    deadline = time.time() + 10
    while not any(isinstance(o, (list, tuple)) and o[1] and o[1].get("status") == "waiting" for o in job.outputs()):
        assert time.time() < deadline, "the request never reached the engine's queue"
        time.sleep(0.01)
    job.cancel()  # the handler runs and its request waits behind the holder
    deadline = time.time() + 10
    while job.status().code.name not in ("CANCELLED", "FINISHED") and time.time() < deadline:
        time.sleep(0.01)
    holder_cancel.set()
    release.set()
    holder.join(10)
    time.sleep(0.3)
    while engine.busy and time.time() < deadline:
        time.sleep(0.01)
    # Only the holder's image is new: the cancelled one ran no step and was not saved.
    assert len(engine.outputs.saved_files()) == before + 1


# -- compiled: zero compiles after warm-up with preview and several images ------------------------

@pytest.mark.slow
def test_preview_and_several_images_compile_nothing_after_warm_up(tiny_settings, demo_models, monkeypatch):
    from neuron_backend.image import engine as image_engine

    monkeypatch.setattr(image_engine, "PREVIEW_INTERVAL_S", 0.0)  # a preview at every step
    settings = tiny_settings.replace(sizes=SIZES, compile="on", max_steps=4, default_steps=2)
    engine = make_engine(settings, demo_models)
    assert engine.placement.compile and engine.preview_table is not None
    engine.shapes.gated = True
    for size in SIZES:
        engine.warm_up(size)
    before, frames = CompileCounter.graphs(), []
    with torch.compiler.set_stance("fail_on_recompile"):
        for size in SIZES:
            results = engine.generate_run(ImageRequest("fox", size, steps=4, seed=1, count=3), preview=frames.append)
            assert [r.compiled_graphs for r in results] == [0, 0, 0]
            for frame in frames:
                frame.image()
    assert frames and CompileCounter.graphs() == before
