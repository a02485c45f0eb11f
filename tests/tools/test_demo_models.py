"""The tiny demo models load and run through the same calls as the real checkpoints; the plug-in builds them for
the core, which refuses them without it."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
import torch
from safetensors.torch import load_file
from support.app import SIZES

from neuron_backend.errors import ConfigError
from neuron_backend.plugins import Parts
from neuron_backend.runtime import Backend, model_folder
from neuron_backend.settings import parse_settings
from tools.demo_models import plugin as demo_builder
from tools.demo_models.build import (
    CHAT_TEMPLATE,
    DEMO_DIR_NAME,
    DEMO_WORDS,
    MARKER_NAME,
    RECIPE_VERSION,
    build_tiny_chat_model,
    build_tiny_tokenizer,
    ensure_demo_models,
    is_demo_model,
)

# Another busy process otherwise slows the tiny models tenfold on 2 cores.
torch.set_num_threads(1)

GENERATION_PROMPT = "<|im_start|>assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def chat(demo_models):
    """The demo chat model reloaded through the Auto classes, as the app loads Qwen3-0.6B."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_models.chat), AutoModelForCausalLM.from_pretrained(demo_models.chat)


def _prompt_ids(tok, text="Hello there"):
    messages = [{"role": "user", "content": text}]
    return tok.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=False, return_tensors="pt", return_dict=True
    )


def test_chat_model_reloads_with_qwen3_shape(chat, demo_models):
    tok, model = chat
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert model.config.vocab_size >= len(tok)
    assert model.config.tie_word_embeddings
    assert model.config.max_position_embeddings >= 4096
    assert model.dtype == torch.float32
    assert model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    assert tok.pad_token == "<|endoftext|>"
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert is_demo_model(demo_models.chat)


def test_greedy_generation_streams_words_with_dynamic_and_static_cache(chat):
    tok, model = chat
    inputs = _prompt_ids(tok)
    prompt_len = inputs["input_ids"].shape[1]
    dynamic = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    static = model.generate(**inputs, max_new_tokens=6, do_sample=False, cache_implementation="static")
    assert torch.equal(dynamic, static)
    new_tokens = dynamic[0, prompt_len:].tolist()
    assert len(new_tokens) >= 1
    text = tok.decode(new_tokens, skip_special_tokens=True)
    # Only whole demo words come out, each with a leading space, so a streamer can flush per word.
    assert text.startswith(" ")
    assert set(text.split()) <= set(DEMO_WORDS)


def test_streamer_yields_text_word_by_word(chat):
    from transformers import TextIteratorStreamer

    tok, model = chat
    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True, timeout=30)
    worker = threading.Thread(
        target=model.generate,
        kwargs={**_prompt_ids(tok), "max_new_tokens": 6, "do_sample": False, "streamer": streamer},
    )
    worker.start()
    chunks = list(streamer)
    worker.join()
    # The streamer holds text back until a space; demo words start with one, so it flushes often.
    assert len([c for c in chunks if c]) >= 3


def test_sampling_uses_only_the_demo_vocabulary(chat):
    tok, model = chat
    torch.manual_seed(1)
    out = model.generate(**_prompt_ids(tok), max_new_tokens=20)  # sampling, from generation_config
    allowed = {tok.convert_tokens_to_ids("Ġ" + w) for w in DEMO_WORDS} | {tok.eos_token_id, tok.pad_token_id}
    assert set(out[0, _prompt_ids(tok)["input_ids"].shape[1] :].tolist()) <= allowed


def test_tokenizer_round_trips_any_text(tokenizer):
    text = "Hello, world! مرحبا بالعالم 👋🏽 naïve 日本語\n\ttabs  and  spaces"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    # Demo words encode to single tokens, as real BPE words do.
    assert len(tokenizer(" hello world")["input_ids"]) == 2


def test_think_tags_survive_skip_special_tokens(tokenizer):
    ids = tokenizer("<|im_start|>assistant\n<think>\nhmm\n</think>\n\nhi<|im_end|><|endoftext|>")["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<think>") in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhmm\n</think>\n\nhi"


def test_chat_template_thinking_switch(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    off = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    on = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    default = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert off == head + GENERATION_PROMPT + EMPTY_THINK
    assert on == default == head + GENERATION_PROMPT


def test_chat_template_strips_earlier_think_blocks(tokenizer):
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nsecret reasoning\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert "secret reasoning" not in text
    assert text == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n" + GENERATION_PROMPT
    )


def test_saved_tokenizer_keeps_template(demo_models):
    assert (demo_models.chat / "chat_template.jinja").read_text() == CHAT_TEMPLATE


@pytest.mark.parametrize(("width", "height"), [(64, 64), (128, 64)])
def test_image_pipeline_reloads_and_renders_requested_size(demo_models, width, height):
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(demo_models.image)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.config.is_distilled
    assert is_demo_model(demo_models.image)
    steps = []
    image = pipe(
        prompt="a lighthouse at dusk",
        width=width,
        height=height,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        callback_on_step_end=lambda p, i, t, kw: steps.append(i) or kw,
    ).images[0]
    assert image.size == (width, height)
    assert image.mode == "RGB"
    assert steps == [0, 1]


def test_ensure_demo_models_is_idempotent_and_rebuilds_incomplete(tmp_path):
    models = ensure_demo_models(tmp_path)
    assert models.chat == tmp_path / "demo-models" / "qwen3-tiny"
    assert models.image == tmp_path / "demo-models" / "flux2-klein-tiny"
    chat_marker, image_marker = models.chat / MARKER_NAME, models.image / MARKER_NAME
    assert chat_marker.read_text().strip() == RECIPE_VERSION
    first = (chat_marker.stat().st_mtime_ns, image_marker.stat().st_mtime_ns)

    assert ensure_demo_models(tmp_path) == models
    assert (chat_marker.stat().st_mtime_ns, image_marker.stat().st_mtime_ns) == first

    # An interrupted build (no marker) and a leftover temp folder from a dead builder.
    chat_marker.unlink()
    (models.chat / "model.safetensors").write_bytes(b"truncated")
    (tmp_path / "demo-models" / ".qwen3-tiny.tmp-dead").mkdir()
    ensure_demo_models(tmp_path)
    assert chat_marker.read_text().strip() == RECIPE_VERSION
    assert image_marker.stat().st_mtime_ns == first[1]
    assert load_file(models.chat / "model.safetensors")  # a real weights file again
    assert sorted(p.name for p in (tmp_path / "demo-models").iterdir()) == [
        ".build.lock",
        "flux2-klein-tiny",
        "qwen3-tiny",
    ]


def test_outdated_recipe_is_rebuilt(tmp_path, demo_models):
    shutil.copytree(demo_models.image, tmp_path / "demo-models" / "flux2-klein-tiny")  # only the chat is stale
    folder = build_tiny_chat_model(tmp_path / "demo-models" / "qwen3-tiny")
    (folder / MARKER_NAME).write_text("neuron-demo-models v0\n")
    assert is_demo_model(folder)  # still a demo model, just not the current recipe
    ensure_demo_models(tmp_path)
    assert (folder / MARKER_NAME).read_text().strip() == RECIPE_VERSION


def test_is_demo_model_false_for_other_folders(tmp_path):
    assert not is_demo_model(tmp_path)
    assert not is_demo_model("Qwen/Qwen3-0.6B")


def _same_weights(a, b):
    first, second = load_file(a), load_file(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_builds_are_deterministic_and_leave_rng_alone(tmp_path, demo_models):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    again = ensure_demo_models(tmp_path)
    assert torch.equal(torch.rand(1), expected_next)
    assert _same_weights(demo_models.chat / "model.safetensors", again.chat / "model.safetensors")
    for part in ("transformer", "vae"):
        name = f"{part}/diffusion_pytorch_model.safetensors"
        assert _same_weights(demo_models.image / name, again.image / name)
    assert _same_weights(
        demo_models.image / "text_encoder/model.safetensors", again.image / "text_encoder/model.safetensors"
    )


# ----- demo model folders ------------------------------------------------------------------------------
def test_a_failed_image_demo_build_leaves_chat_working(tmp_path, monkeypatch):
    """Each engine's demo model is built on its own (a full disk spares chat)."""
    from neuron_backend.chat.text import ChatRequest
    from tools.demo_models import build

    def disk_full(folder):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(build, "build_tiny_image_pipeline", disk_full)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--sizes", SIZES],
                              env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    status = backend.status()
    assert status["engines"]["chat"]["state"] == "ready", status["engines"]
    assert status["engines"]["image"]["state"] == "failed"
    reason = status["engines"]["image"]["reason"]
    assert "No space left on device" in reason and "rebuild" in reason
    assert list(backend.stream_chat(ChatRequest(message="hi", max_new_tokens=2)))[-1].done


@pytest.mark.slow
def test_a_corrupt_demo_folder_is_rebuilt(tmp_path, demo_models):
    """A garbled config or truncated weights no longer fail every start."""
    shutil.copytree(demo_models.chat.parent, tmp_path / DEMO_DIR_NAME)
    models = ensure_demo_models(tmp_path)
    (models.image / "model_index.json").write_text("garbage{")
    weights = next(models.chat.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    ensure_demo_models(tmp_path)
    json.loads((models.image / "model_index.json").read_text())
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--sizes", "64x64"],
                              env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    assert {e["state"] for e in backend.status()["engines"].values()} == {"ready"}


# ----- the seam: the plug-in builds, the core asks -----------------------------------------------------------
NO_BUILDER = ("--models: tiny needs a plug-in that builds the demo models, and none is installed: list one in "
              "app.py's PLUGINS, or pass --models full")


def _tiny(root, *extra):
    return parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--sizes", "64x64",
                           "--chat-buckets", "32", "--context-length", "128", "--references", "0", *extra], env={})


def test_the_core_without_the_plug_in_refuses_the_demo_models(tmp_path):
    settings = _tiny(tmp_path)
    with pytest.raises(ConfigError) as err:
        model_folder(settings, "chat", Parts().demo_models)
    assert str(err.value) == NO_BUILDER and err.value.flag == "--models"
    backend = Backend(settings)  # no plug-in's parts: nothing builds the demo models
    backend.runner.run()
    engines = backend.status()["engines"]
    assert {name: e["state"] for name, e in engines.items()} == {"chat": "failed", "image": "failed"}
    assert all(NO_BUILDER in e["reason"] for e in engines.values()), engines
    assert not (tmp_path / DEMO_DIR_NAME).exists()  # nothing was built


def test_the_plug_in_builds_each_engines_folder_and_the_app_lists_it(tmp_path, demo_models):
    from app import PLUGINS

    assert demo_builder in PLUGINS
    assert demo_builder.plug(_tiny(tmp_path)) == Parts(demo_models=demo_builder.demo_folder)
    settings = _tiny(tmp_path / "chat-only", "--no-image")
    chat = model_folder(settings, "chat", demo_builder.demo_folder)
    assert chat == tmp_path / "chat-only" / DEMO_DIR_NAME / "qwen3-tiny" and is_demo_model(chat)
    assert not (chat.parent / "flux2-klein-tiny").exists()  # only the engine asked for is built
    assert _same_weights(demo_models.chat / "model.safetensors", chat / "model.safetensors")  # as built before
    shutil.copytree(demo_models.chat.parent, tmp_path / "linked" / DEMO_DIR_NAME)
    settings = _tiny(tmp_path / "linked")
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    assert {e["state"] for e in backend.status()["engines"].values()} == {"ready"}
    assert backend.model_folders() == {"chat": tmp_path / "linked" / DEMO_DIR_NAME / "qwen3-tiny",
                                       "image": tmp_path / "linked" / DEMO_DIR_NAME / "flux2-klein-tiny"}


def test_autos_fallback_without_the_plug_in_fails_that_engine_saying_what_to_do(tmp_path, demo_models):
    wrong = tmp_path / "wrong-arch"
    shutil.copytree(demo_models.chat, wrong)
    (wrong / MARKER_NAME).unlink()
    config = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "model_type": "no-such-architecture"}))
    settings = parse_settings(["--models", "auto", "--chat-model", str(wrong), "--no-image", "--device", "cpu",
                               "--cache-dir", str(tmp_path), "--chat-buckets", "32", "--context-length", "128"],
                              env={}, weights_available=lambda model, timeout: (True, "test folder"))
    backend = Backend(settings)
    backend.runner.run()
    chat = backend.status()["engines"]["chat"]
    assert chat["state"] == "failed" and NO_BUILDER in chat["reason"], chat
    assert not backend.status()["fallbacks"]  # no fallback is claimed that could not be built
