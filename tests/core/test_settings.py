"""Settings: flags, environment, presets, and every validation error."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from app import PLUGINS
from neuron_backend.errors import ConfigError
from neuron_backend.plugins import plug_all
from neuron_backend.settings import FULL_PRESET, TINY_PRESET, Settings, env_name, parse_settings
from neuron_backend.shapes import ImageSize
from tools.cache.plugin import bundle_flags
from tools.parallel.plugin import Choice
from tools.parallel.plugin import choice as tensor_parallel


def parse(*argv: str, env: dict | None = None, available=(True, "cached")) -> Settings:
    """The settings app.py starts with, its plug-ins' flags checked as it checks them."""
    settings = parse_settings(list(argv), env=env or {}, weights_available=lambda model, timeout: available,
                              plugins=PLUGINS)
    plug_all(PLUGINS, settings)
    return settings


def test_tiny_preset_defaults():
    s = parse("--models", "tiny")
    assert s.models == "tiny" and s.demo
    assert s.sizes == TINY_PRESET.sizes and s.buckets == TINY_PRESET.buckets
    assert s.host == "127.0.0.1" and s.port == 7860 and s.auth is None
    assert s.compile == "auto" and s.chat and s.image


def test_full_preset_defaults():
    s = parse("--models", "full")
    assert s.models == "full" and not s.demo
    assert s.chat_model == "Qwen/Qwen3-0.6B" and s.image_model == "black-forest-labs/FLUX.2-klein-4B"
    assert ImageSize(1024, 1024) in s.sizes and s.sizes == FULL_PRESET.sizes
    assert s.buckets[-1] < s.context_length


def test_auto_uses_full_when_weights_available():
    s = parse(available=(True, "in cache"))
    assert s.models_requested == "auto" and s.models == "full"


def test_auto_falls_back_to_tiny_and_says_why():
    s = parse(available=(False, "Qwen/Qwen3-0.6B is not in the local cache and the Hub is unreachable"))
    assert s.models == "tiny"
    assert "unreachable" in s.models_reason and "demo models" in s.models_reason


def test_auto_checks_only_enabled_engines():
    asked = []
    parse_settings(["--no-image"], env={}, weights_available=lambda m, t: asked.append(m) or (True, ""))
    assert asked == ["Qwen/Qwen3-0.6B"]


def test_auto_with_real_probe_offline_is_tiny(tmp_path):
    # The real probe: nothing cached under an empty HF_HOME, hub offline -> tiny, fast.
    code = (
        "from neuron_backend.settings import parse_settings;"
        "s = parse_settings([], env={});print(s.models, '|', s.models_reason)"
    )
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tiny |") and "HF_HUB_OFFLINE" in out.stdout


def test_local_folder_counts_as_available_only_when_complete(tmp_path, demo_models):
    from neuron_backend.weights import weights_available

    assert weights_available(str(demo_models.chat), 1.0, "chat")[0]
    (tmp_path / "config.json").write_text("{}")  # a config alone: tokenizer and weights missing
    ok, why = weights_available(str(tmp_path), 1.0, "chat")
    assert not ok and "model.safetensors" in why and "tokenizer.json" in why
    empty = tmp_path / "empty"
    empty.mkdir()
    ok, why = weights_available(str(empty), 1.0)
    assert not ok and "config.json" in why


def test_flags_override_environment_and_environment_overrides_presets():
    env = {env_name("sizes"): "512x512", env_name("port"): "9000", env_name("share"): "yes"}
    s = parse("--models", "tiny", env=env)
    assert s.sizes == (ImageSize(512, 512),) and s.port == 9000 and s.share is True
    s = parse("--models", "tiny", "--sizes", "64x64,128x64", "--port", "9001", env=env)
    assert s.sizes == (ImageSize(64, 64), ImageSize(128, 64)) and s.port == 9001


def test_space_environment_sets_host_and_port():
    s = parse("--models", "tiny", env={"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"})
    assert s.host == "0.0.0.0" and s.port == 7861


def test_every_flag_parses():
    s = parse(
        "--models", "tiny", "--chat-model", "/m/chat", "--image-model", "/m/img", "--device", "cpu",
        "--chat-device", "cpu", "--image-device", "cpu", "--dtype", "float32", "--sizes", "64x64",
        "--chat-buckets", "64,16,32", "--context-length", "128", "--max-new-tokens", "20",
        "--default-steps", "2", "--max-steps", "6", "--compile", "on", "--compile-repeated-blocks",
        "--cache-dir", "/tmp/x", "--host", "0.0.0.0", "--port", "0", "--share", "--auth", "u:p:w",
        "--no-image", "--warmup-order", "image,chat", "--queue-size", "3", "--max-prompt-chars", "50",
        "--max-saved-images", "7", "--hub-timeout", "2.5", "--cache-bundle", "hf://o/r@v",
        "--cache-bundle-sha256", "AB" * 32,
    )
    assert s.buckets == (16, 32, 64) and s.context_length == 128 and s.max_new_tokens == 20
    assert s.auth == ("u", "p:w") and not s.image and s.chat and s.compile_repeated_blocks
    assert s.cache_dir == Path("/tmp/x") and s.warmup_order == ("image", "chat") and s.hub_timeout == 2.5
    assert bundle_flags(s) == ("hf://o/r@v", "ab" * 32)
    assert dataclasses.is_dataclass(s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("argv", "flag", "fragment"),
    [
        (["--models", "huge"], "--models", "auto|full|tiny"),
        (["--device", "tpu"], "--device", "auto, neuron, cuda, cpu"),
        (["--chat-device", "gpu:0"], "--chat-device", "auto, neuron, cuda, cpu"),
        (["--sizes", "1000x1000"], "--sizes", "multiples of 16"),
        (["--sizes", "1024"], "--sizes", "WIDTHxHEIGHT"),
        (["--sizes", "0x0"], "--sizes", "multiples of 16"),
        (["--sizes", ","], "--sizes", "no size"),
        (["--chat-buckets", "64,300", "--context-length", "256"], "--chat-buckets", "smaller than 256"),
        (["--chat-buckets", "a,b"], "--chat-buckets", "whole number"),
        (["--chat-buckets", "0,8"], "--chat-buckets", "1 or more"),
        (["--context-length", "1"], "--context-length", "2 or more"),
        (["--max-new-tokens", "0"], "--max-new-tokens", "1 or more"),
        (["--max-steps", "0"], "--max-steps", "1 to 1000"),
        (["--default-steps", "9", "--max-steps", "4"], "--default-steps", "1 to --max-steps"),
        (["--compile", "maybe"], "--compile", "auto|on|off"),
        (["--compile", "off", "--compile-repeated-blocks"], "--compile-repeated-blocks", "--compile on|auto"),
        (["--dtype", "int8"], "--dtype", "bfloat16"),
        (["--port", "70000"], "--port", "0 to 65535"),
        (["--port", "http"], "--port", "whole number"),
        (["--auth", "nopassword"], "--auth", "user:password"),
        (["--no-chat", "--no-image"], "--no-chat/--no-image", "at most one"),
        (["--warmup-order", "image,video"], "--warmup-order", "chat,image"),
        (["--queue-size", "0"], "--queue-size", "1 or more"),
        (["--max-session-jobs", "0"], "--max-session-jobs", "1 or more"),
        (["--max-file-size", "100"], "--max-file-size", "65536 (64 KiB) or more"),
        (["--max-request-bytes", "100"], "--max-request-bytes", "65536 (64 KiB) or more"),
        (["--hub-timeout", "-1"], "--hub-timeout", "above 0"),
        (["--tp-engine", "vae"], "--tp-engine", "chat|image"),
        (["--cache-bundle", "b.tar.gz"], "--cache-bundle", "--cache-bundle-sha256 <sha256 of the archive>"),
        (["--cache-bundle", "b.tar.gz", "--cache-bundle-sha256", "f00"], "--cache-bundle-sha256", "64 hex digits"),
        (["--cache-bundle-sha256", "ab" * 32], "--cache-bundle-sha256", "--cache-bundle PATH"),
    ],
)
def test_validation_errors_name_flag_and_allowed_values(argv, flag, fragment):
    with pytest.raises(ConfigError) as info:
        parse("--models", "tiny", *argv)
    assert info.value.flag == flag
    assert str(info.value).startswith(flag) and fragment in str(info.value)


@pytest.mark.parametrize(("argv", "flag", "fragment"), [
    (["--sizes", "5" * 5000 + "x64"], "--sizes", "multiples of 16 between 16 and 4096"),
    (["--sizes", "64x64,64x" + "5" * 5000], "--sizes", "multiples of 16 between 16 and 4096"),
    (["--port", "5" * 5000], "--port", "a whole number of at most 20 digits"),
    (["--max-steps", "x" * 5000], "--max-steps", "at most 20 digits"),
], ids=["width", "height", "port", "not digits"])
def test_a_5000_character_number_is_refused_shortly(argv, flag, fragment):
    # int() of over 4300 digits raises Python's own "Exceeds the limit ..." ValueError
    with pytest.raises(ConfigError) as err:
        parse(*argv)
    message = str(err.value)
    assert err.value.flag == flag and fragment in message
    assert len(message) < 300 and "Exceeds the limit" not in message and "int_max_str_digits" not in message


def test_bad_boolean_environment_variable():
    with pytest.raises(ConfigError, match="SHOWCASE_SHARE"):
        parse("--models", "tiny", env={env_name("share"): "perhaps"})


def test_replace_revalidates():
    s = parse("--models", "tiny")
    assert s.replace(compile="on").compile == "on"
    with pytest.raises(ConfigError, match="--max-new-tokens"):
        s.replace(max_new_tokens=0)


def test_tp_engine_names_the_sharded_engine():
    torchrun = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    assert tensor_parallel(parse("--models", "tiny")).engine == "chat"
    s = parse("--models", "tiny", "--tp", "2", env={**torchrun, env_name("tp-engine"): "image"})
    assert tensor_parallel(s) == Choice(2, "image")
    # The unsharded engine may be off; the sharded one may not.
    assert not parse("--models", "tiny", "--tp", "2", "--tp-engine", "image", "--no-chat", env=torchrun).chat
    with pytest.raises(ConfigError, match=r"^--tp: shards the image engine .*--no-image disables.*--tp-engine chat"):
        parse("--models", "tiny", "--tp", "2", "--tp-engine", "image", "--no-image", env=torchrun)
    # Chat batch slots are refused only where the followers would have to mirror them (sharded chat).
    batched = parse("--models", "tiny", "--tp", "2", "--tp-engine", "image", "--chat-batch", "4", env=torchrun)
    assert plug_all(PLUGINS, batched).chat_rows == 4
    with pytest.raises(ConfigError, match=r"^--chat-batch: .*--tp-engine image"):
        parse("--models", "tiny", "--tp", "2", "--chat-batch", "4", env=torchrun)
    with pytest.raises(ConfigError, match="--tp-engine"):
        tensor_parallel(s.replace(options={**s.options, "tp_engine": "vae"}))


SHA = "0123456789abcdef0123456789abcdef01234567"


def test_a_model_may_name_its_revision_by_flag_or_environment():
    s = parse("--models", "full", "--chat-model", f"Qwen/Qwen3-0.6B@{SHA}", "--image-model", "org/klein@v1.0")
    assert (s.chat_model, s.chat_revision) == ("Qwen/Qwen3-0.6B", SHA)
    assert (s.image_model, s.image_revision) == ("org/klein", "v1.0")
    s = parse("--models", "full", env={env_name("chat-model"): "org/chat@refs/pr/1",
                                       env_name("image-model"): "org/klein@main"})
    assert (s.chat_model, s.chat_revision, s.image_model, s.image_revision) == ("org/chat", "refs/pr/1",
                                                                                "org/klein", "main")
    plain = parse("--models", "full")  # without @: main, as before
    assert (plain.chat_model, plain.chat_revision, plain.image_revision) == ("Qwen/Qwen3-0.6B", None, None)


def test_the_real_probe_hears_the_revision(monkeypatch):
    from neuron_backend import weights

    asked = []
    monkeypatch.setattr(weights, "weights_available",
                        lambda model, timeout, kind, revision: asked.append((model, kind, revision)) or (True, ""))
    parse_settings(["--chat-model", "org/chat@v2", "--image-model", "org/klein"], env={})
    assert asked == [("org/chat", "chat", "v2"), ("org/klein", "image", None)]


def test_an_at_sign_inside_an_existing_path_is_part_of_the_path(tmp_path):
    folder = tmp_path / "models@v1" / "qwen@2"
    folder.mkdir(parents=True)
    s = parse("--models", "full", "--chat-model", str(folder), env={env_name("image-model"): str(folder)})
    assert (s.chat_model, s.chat_revision, s.image_model, s.image_revision) == (str(folder), None, str(folder), None)


@pytest.mark.parametrize("value", ["org/name@", "org/name@v1@v2", "@v1", "org/name@v 1", "org/name@../main",
                                   "org/name@" + "a" * 300])
def test_a_bad_revision_is_refused_naming_the_form(value):
    with pytest.raises(ConfigError) as err:
        parse("--models", "full", "--image-model", value)
    message = str(err.value)
    assert err.value.flag == "--image-model" and "org/name@revision (a branch, tag or commit sha)" in message
    assert len(message) < 300 and "Traceback" not in message


def test_a_revision_of_a_local_folder_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse("--models", "full", "--chat-model", f"{tmp_path}@v1")
    assert err.value.flag == "--chat-model" and "is a local folder, which has no revision" in str(err.value)
