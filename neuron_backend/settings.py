"""One frozen Settings object, built in one place from flags, environment and presets.

Where a value comes from, highest first: command-line flag, ``SHOWCASE_<FLAG>`` (so a Space needs no flags),
the preset of the chosen model set (full or tiny). Nothing else in the backend reads ``os.environ``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError, InvalidRequestError
from .messages import shown_value, tr
from .shapes import MAX_REFERENCES, ImageSize, parse_size, served_counts

ENV_PREFIX = "SHOWCASE_"
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
MAX_INT_CHARS = 20  # the longest whole-number setting read (a signed 64-bit value has at most 20 characters)

# name, type, help; the env var is SHOWCASE_<NAME upper, dashes as underscores>.
_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("models", "str", "auto|full|tiny: real models, offline demo models, or full where available"),
    ("chat-model", "str", "chat model: hub id[@revision] (a branch, tag or commit sha; default main) or local folder"),
    ("image-model", "str", "image model: hub id[@revision] (a branch, tag or commit; default main) or local folder"),
    ("device", "str", "auto|neuron|cuda|cpu (optionally :N) for both engines"),
    ("chat-device", "str", "device of the chat engine, e.g. neuron:0"),
    ("image-device", "str", "device of the image engine, e.g. neuron:1"),
    ("dtype", "str", "auto|bfloat16|float16|float32 (auto: bfloat16 on accelerators, float32 on CPU)"),
    ("sizes", "str", "comma-separated precompiled image sizes WxH"),
    ("references", "str", "comma-separated reference-image counts an image request may carry for editing, "
                          "0 (text-to-image) included; each count at each size is one more warm-up graph"),
    ("chat-buckets", "str", "comma-separated prompt length buckets in tokens"),
    ("context-length", "int", "fixed KV-cache length in tokens"),
    ("cache-windows", "str", "comma-separated KV-cache windows in tokens (one decode graph each; 'none': only "
                             "the whole cache); a step attends over the smallest window that holds the text so far"),
    ("max-new-tokens", "int", "most tokens one reply may generate"),
    ("prefill-chunk", "str", "N|auto|0: with compile on, the prompt runs compiled in chunks of N tokens, which must "
                             "divide every bucket (auto: the largest such N; 0 or off: eager prefill)"),
    ("default-steps", "int", "default denoising steps"),
    ("max-steps", "int", "most denoising steps one request may ask for"),
    ("compile", "str", "auto|on|off: torch.compile (auto: on for neuron, off elsewhere)"),
    ("compile-repeated-blocks", "tri", "auto|on|off: compile each repeated transformer block once (faster compile; "
                                       "alone: on; auto: on where the image engine compiles on neuron)"),
    ("compile-timeout-min", "float", "minutes per graph; a neuronx-cc still making progress is never ended (0: none)"),
    ("cache-dir", "str", "root folder for compile caches, timing history, demo models, outputs"),
    ("host", "str", "address to bind (default 127.0.0.1; a Space sets GRADIO_SERVER_NAME)"),
    ("port", "int", "port to listen on"),
    ("share", "bool", "create a public Gradio share link"),
    ("auth", "str", "user:password protecting the UI and the API"),
    ("forwarded-allow-ips", "str", "comma-separated proxy addresses whose X-Forwarded-For the server trusts (a proxy "
                                   "on this host: 127.0.0.1); default none: every client is its own address"),
    ("no-chat", "bool", "disable the chat engine"),
    ("no-image", "bool", "disable the image engine"),
    ("warmup-order", "str", "comma-separated engine order for warm-up, e.g. image,chat"),
    ("queue-size", "int", "most requests waiting in the queue before 'busy, try again'"),
    ("max-session-jobs", "int", "most jobs one browser or API session may have waiting or running at once"),
    ("max-file-size", "int", "largest file one upload may carry, in bytes (refused above)"),
    ("max-request-bytes", "int", "largest request body any other route accepts, in bytes (refused above)"),
    ("max-prompt-chars", "int", "longest accepted prompt in characters"),
    ("max-history-messages", "int", "most chat history messages one request may carry (refused above)"),
    ("max-history-chars", "int", "most characters of chat history one request may carry (refused above)"),
    ("max-saved-images", "int", "images kept under the cache root; the oldest are removed"),
    ("no-image-preview", "bool", "no live preview while an image denoises (on by default; host-side, no compile)"),
    ("max-images-per-run", "int", "most images one Image-tab run may ask for (consecutive seeds, one after another)"),
    ("hub-timeout", "float", "seconds to wait for the Hugging Face Hub when --models auto"),
)


def env_name(flag: str) -> str:
    """The environment variable matching ``--flag``."""
    return ENV_PREFIX + flag.upper().replace("-", "_")


def add_flag(parser, name: str, kind: str, help_text: str) -> None:
    """``--name`` on ``parser`` (or an argument group): kind str, int, float, bool or tri (auto|on|off; given
    alone it means on, like a bool). Its default is None: presets and plug-ins fill it later."""
    extra = {"bool": {"action": "store_const", "const": True}, "tri": {"nargs": "?", "const": "on"}}.get(kind, {})
    parser.add_argument(f"--{name}", default=None, help=f"{help_text} [env {env_name(name)}]", **extra)


def build_parser(plugins: Sequence = ()) -> argparse.ArgumentParser:
    """The argparse parser: the core's flags, then each plug-in's (``plugin.add_flags``) in a group of its own."""
    parser = argparse.ArgumentParser(prog="app.py", description="Hugging Face models on AWS Trainium: chat and image.",
        epilog=f"Any flag can be set as an environment variable {ENV_PREFIX}<FLAG>, e.g. {env_name('models')}=tiny.")
    for name, kind, help_text in _FLAGS:
        add_flag(parser, name, kind, help_text)
    for plugin in plugins:
        plugin.add_flags(parser)
    return parser


def _raw_values(argv: Sequence[str] | None, env: Mapping[str, str], plugins: Sequence) -> dict[str, object]:
    """Flag values by field name, flags first, then SHOWCASE_* environment variables."""
    parser = build_parser(plugins)
    args = vars(parser.parse_args(argv))
    raw: dict[str, object] = {}
    for action in parser._actions:  # every flag, plug-ins' too: argparse lists no other way
        name = next((o[2:] for o in action.option_strings if o.startswith("--")), None)
        if name is None or action.dest == "help":
            continue
        value = args.get(action.dest)
        if value is None and env.get(env_name(name), "") != "":
            value = env[env_name(name)]
            if action.const is True:  # a bool flag
                value = _parse_bool(name, str(value))
        if value is not None:
            raw[action.dest] = value
    return raw


def as_tri(flag: str, value: object) -> str:
    """auto|on|off from a flag or its environment variable (1/0, true/false, yes/no also accepted)."""
    text = str(value).strip().lower()
    return ("on" if _BOOLS[text] else "off") if text in _BOOLS else as_choice(flag, text, ("auto", "on", "off"))


def _parse_bool(flag: str, text: str) -> bool:
    if text.strip().lower() in _BOOLS:
        return _BOOLS[text.strip().lower()]
    raise ConfigError(env_name(flag), f"{text!r} is not a boolean", "1/0, true/false, yes/no, on/off")


def as_int(flag: str, value: object) -> int:
    text = str(value).strip()
    if len(text) > MAX_INT_CHARS:  # int() of over 4300 digits raises its own ValueError; no setting is that big
        raise ConfigError(f"--{flag}", f"{shown_value(text)} ({len(text)} characters) is too long",
                          f"a whole number of at most {MAX_INT_CHARS} digits")
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--{flag}", f"{shown_value(value)} is not a whole number") from None


def as_float(flag: str, value: object) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        raise ConfigError(f"--{flag}", f"{shown_value(value)} is not a number") from None


def as_choice(flag: str, value: object, choices: Sequence[str]) -> str:
    """One of ``choices`` (case and spaces ignored), else a ConfigError naming ``--flag`` and them."""
    if (text := str(value).strip().lower()) not in choices:
        raise ConfigError(f"--{flag}", f"unknown value {value!r}", "|".join(choices))
    return text


def _parse_sizes(value: object) -> tuple[ImageSize, ...]:
    sizes = []
    for part in (part for part in str(value).split(",") if part.strip()):
        try:
            sizes.append(parse_size(part))
        except InvalidRequestError as exc:
            raise ConfigError("--sizes", str(exc), "WxH, multiples of 16, e.g. 1024x1024,1344x768") from None
    if not sizes:
        raise ConfigError("--sizes", "no size given", "WxH, multiples of 16, e.g. 1024x1024")
    return tuple(dict.fromkeys(sizes))


def _parse_references(value: object) -> tuple[int, ...]:
    counts = sorted({as_int("references", p) for p in str(value).split(",") if p.strip()})
    if not counts:
        raise ConfigError("--references", "no count given", f"comma-separated counts from 0 to {MAX_REFERENCES}, "
                          "e.g. 0,1,2")
    return tuple(counts)


def _parse_windows(value: object) -> tuple[int, ...]:
    if str(value).strip().lower() in ("", "none"):
        return ()
    return tuple(sorted({as_int("cache-windows", p) for p in str(value).split(",") if p.strip()}))


def _parse_prefill_chunk(value: object) -> int | None:
    """None: auto (the largest chunk that divides every bucket); 0: eager prefill."""
    text = str(value).strip().lower()
    return None if text == "auto" else 0 if text == "off" else as_int("prefill-chunk", text)


def _parse_buckets(value: object) -> tuple[int, ...]:
    buckets = sorted({as_int("chat-buckets", p) for p in str(value).split(",") if p.strip()})
    if not buckets:
        raise ConfigError("--chat-buckets", "no bucket given", "comma-separated token counts, e.g. 256,1024")
    return tuple(buckets)


def _parse_auth(value: object) -> tuple[str, str]:
    user, sep, password = str(value).partition(":")
    if not sep or not user or not password:
        raise ConfigError("--auth", "expected user:password", "a non-empty user and password separated by ':'")
    return user, password


def _exists(path: str) -> bool:
    """Whether ``path`` exists (False for a name the OS refuses: too long, a NUL byte)."""
    return os.path.exists(os.path.expanduser(path))


def _parse_model(flag: str, value: object) -> tuple[str, str | None]:
    """(hub id or folder, revision or None) of ``--chat-model``/``--image-model``.

    A path that exists is a local folder, whatever it holds: an ``@`` in it is part of the path. Otherwise
    ``org/name@revision`` pins the Hub revision (a branch, tag or commit sha); without ``@`` it is main.
    """
    text = str(value)
    if "@" not in text or _exists(text):
        return text, None
    name, _, revision = text.partition("@")
    form = "org/name, org/name@revision (a branch, tag or commit sha) or a local folder"
    if not name or not _REVISION_RE.fullmatch(revision) or {".", ".."} & set(revision.split("/")):
        raise ConfigError(f"--{flag}", f"{shown_value(text)} is not a model with a revision", form)
    if _exists(name):
        raise ConfigError(f"--{flag}", f"{shown_value(name)} is a local folder, which has no revision",
                          f"the folder alone, or a hub id: {form}")
    return name, revision


def _optional_lower(value: object) -> str | None:
    return None if value is None else str(value).strip().lower()


DEFAULT_CHAT_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_IMAGE_MODEL = "black-forest-labs/FLUX.2-klein-4B"
_DEVICE_RE = re.compile(r"^(auto|neuron|cuda|cpu)(?::(\d+))?$")
_REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")  # a branch, tag or commit sha; no second @


@dataclass(frozen=True)
class Preset:
    """Shape defaults for one model set; flags override each field."""

    sizes: tuple[ImageSize, ...]
    references: tuple[int, ...]  # reference-image counts a request may carry (0: text-to-image)
    buckets: tuple[int, ...]
    context_length: int
    cache_windows: tuple[int, ...]
    max_new_tokens: int
    default_steps: int


# FLUX.2-klein's published list includes these; Qwen3-0.6B takes 32k tokens but one static
# 4k cache keeps the decode graph and its memory small.
FULL_PRESET = Preset(
    sizes=(ImageSize(1024, 1024), ImageSize(1344, 768), ImageSize(768, 1344)),
    references=(0, 1),  # one reference per size: three more graphs, each as long to compile as its size's
    buckets=(64, 256, 1024, 3072),  # 64: a short first turn with the template (a 256-token prefill costs 3x)
    context_length=4096,
    cache_windows=(512, 1024, 2048),  # + 4096: a short chat's decode reads 512 cache positions, not 4096
    max_new_tokens=1024,
    default_steps=4,
)
# Same aspect ratios, small enough that the random-weight demo runs in a second on a CPU.
TINY_PRESET = Preset(
    sizes=(ImageSize(256, 256), ImageSize(336, 192), ImageSize(192, 336)),
    references=(0, 1),  # editing with one reference; on the demo models each edit slot warms up in a blink
    # The full preset's buckets and cache: with the byte-level demo tokenizer (about a token per
    # character) a pasted 2,000-character paragraph fits and several turns stay; on one CPU thread
    # warm-up takes ~1.6 s (0.1 s with the old 32/64/128 buckets in a 256-token cache).
    buckets=(64, 256, 1024, 3072),
    context_length=4096,
    cache_windows=(),  # the tiny model reads its whole 4096-token cache cheaply; a window would add a decode graph
    max_new_tokens=64,
    default_steps=4,
)


@dataclass(frozen=True)
class Settings:
    """Every setting of the app; build it with ``parse_settings``."""

    models: str = "tiny"  # resolved: "full" or "tiny"
    models_requested: str = "tiny"  # as asked: auto, full or tiny
    models_reason: str = "asked for the demo models"
    chat_model: str = DEFAULT_CHAT_MODEL  # hub id or local folder, without its revision
    image_model: str = DEFAULT_IMAGE_MODEL
    chat_revision: str | None = None  # --chat-model org/name@revision; None: main (a hub id) or a local folder
    image_revision: str | None = None
    device: str = "auto"
    chat_device: str | None = None
    image_device: str | None = None
    dtype: str = "auto"
    sizes: tuple[ImageSize, ...] = TINY_PRESET.sizes
    references: tuple[int, ...] = TINY_PRESET.references  # reference counts served (image/references.py)
    references_set: bool = False  # --references given; else sizes that cannot take references serve none
    buckets: tuple[int, ...] = TINY_PRESET.buckets
    context_length: int = TINY_PRESET.context_length
    cache_windows: tuple[int, ...] = TINY_PRESET.cache_windows  # context_length is always the last window
    max_new_tokens: int = TINY_PRESET.max_new_tokens
    prefill_chunk: int | None = None  # compiled prefill chunk in tokens (None: auto; 0: eager prefill)
    default_steps: int = TINY_PRESET.default_steps
    default_steps_set: bool = False  # --default-steps given; else a non-distilled image model defaults to 50
    max_steps: int = 50
    compile: str = "auto"
    compile_repeated_blocks: str = "auto"  # auto|on|off; devices.repeated_blocks resolves it per placement
    compile_timeout_min: float = 60.0  # one graph's compile time limit (0: none); warmup.py
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "trainium-showcase")
    # this installation's own files, never in the cache (a signing key): $XDG_CONFIG_HOME/trainium-showcase
    config_dir: Path = field(default_factory=lambda: Path.home() / ".config" / "trainium-showcase")
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    auth: tuple[str, str] | None = None
    forwarded_allow_ips: str = ""  # uvicorn's FORWARDED_ALLOW_IPS: peers whose X-Forwarded-For is trusted
    chat: bool = True
    image: bool = True
    warmup_order: tuple[str, ...] = ("chat", "image")
    queue_size: int = 16
    max_session_jobs: int = 2  # one session's jobs waiting or running; the next is refused (ui/guards.py)
    max_file_size: int = 64 * 2**20  # an upload: the largest file the page takes (a PNG to paste back, a QA run)
    max_request_bytes: int = 8 * 2**20  # any other body (a chat history at its limits: ~1.2 MB of JSON)
    max_prompt_chars: int = 20_000
    max_history_messages: int = 200  # a chat request's history, refused above (checked before tokenizing)
    max_history_chars: int = 100_000
    max_saved_images: int = 200
    image_preview: bool = True  # live latent preview on the host (image/preview.py); --no-image-preview
    max_images_per_run: int = 4  # images one run may ask for: generated one after another, same shape
    hub_timeout: float = 5.0
    options: Mapping[str, object] = field(default_factory=dict, repr=False)  # plug-ins' flags as given, by name
    rank: int = 0  # this process's rank under torchrun (RANK), 0 otherwise; a plug-in's --tp shards by rank
    local_rank: int = 0
    world_size: int = 1
    exported_visible_cores: str | None = None  # NEURON_RT_VISIBLE_CORES before import torch (refused under torchrun)

    @property
    def demo(self) -> bool:
        return self.models == "tiny"

    @property
    def prefill_chunk_tokens(self) -> int:
        """The compiled prefill chunk (0: eager): as given, or the largest that divides every bucket."""
        return math.gcd(*self.buckets) if self.prefill_chunk is None else self.prefill_chunk

    def replace(self, **changes) -> Settings:
        """Return a copy with ``changes`` applied and validated again."""
        return validate(dataclasses.replace(self, **changes))


def parse_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                   weights_available: Callable[[str, float], tuple[bool, str]] | None = None,
                   plugins: Sequence = ()) -> Settings:
    """Build and validate the Settings from flags and environment; ``plugins``' flags land in ``options``.

    ``weights_available(model, timeout)`` decides ``--models auto`` (default: look in the
    local Hugging Face cache, then ask the Hub with a bounded timeout).
    """
    env = os.environ if env is None else env
    raw = _raw_values(argv, env, plugins)
    core = {name.replace("-", "_") for name, _, _ in _FLAGS}
    requested = as_choice("models", raw.pop("models", "auto"), ("auto", "full", "tiny"))
    chat_model, chat_revision = _parse_model("chat-model", raw.pop("chat_model", DEFAULT_CHAT_MODEL))
    image_model, image_revision = _parse_model("image-model", raw.pop("image_model", DEFAULT_IMAGE_MODEL))
    models, reason = _resolve_models(requested, ((chat_model, chat_revision), (image_model, image_revision)), raw,
                                     weights_available)
    preset = TINY_PRESET if models == "tiny" else FULL_PRESET
    host_default = env.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    port_default = env.get("GRADIO_SERVER_PORT") or 7860
    settings = Settings(
        models=models,
        models_requested=requested,
        models_reason=reason,
        chat_model=chat_model,
        image_model=image_model,
        chat_revision=chat_revision,
        image_revision=image_revision,
        device=str(raw.get("device", "auto")).strip().lower(),
        chat_device=_optional_lower(raw.get("chat_device")),
        image_device=_optional_lower(raw.get("image_device")),
        dtype=as_choice("dtype", raw.get("dtype", "auto"), ("auto", "bfloat16", "float16", "float32")),
        sizes=_parse_sizes(raw["sizes"]) if "sizes" in raw else preset.sizes,
        references=_parse_references(raw["references"]) if "references" in raw else preset.references,
        references_set="references" in raw,
        buckets=_parse_buckets(raw["chat_buckets"]) if "chat_buckets" in raw else preset.buckets,
        context_length=as_int("context-length", raw.get("context_length", preset.context_length)),
        cache_windows=_parse_windows(raw["cache_windows"]) if "cache_windows" in raw else tuple(
            w for w in preset.cache_windows  # the preset's, within the context length actually chosen
            if w < as_int("context-length", raw.get("context_length", preset.context_length))),
        max_new_tokens=as_int("max-new-tokens", raw.get("max_new_tokens", preset.max_new_tokens)),
        prefill_chunk=_parse_prefill_chunk(raw["prefill_chunk"]) if "prefill_chunk" in raw else None,
        default_steps=as_int("default-steps", raw.get("default_steps", preset.default_steps)),
        default_steps_set="default_steps" in raw,
        max_steps=as_int("max-steps", raw.get("max_steps", 50)),
        compile=as_choice("compile", raw.get("compile", "auto"), ("auto", "on", "off")),
        compile_repeated_blocks=as_tri("compile-repeated-blocks", raw.get("compile_repeated_blocks", "auto")),
        compile_timeout_min=as_float("compile-timeout-min", raw.get("compile_timeout_min", 60.0)),
        cache_dir=Path(str(raw["cache_dir"])).expanduser() if "cache_dir" in raw
        else Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainium-showcase",
        config_dir=Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "trainium-showcase",
        host=str(raw.get("host", host_default)), port=as_int("port", raw.get("port", port_default)),
        share=bool(raw.get("share", False)),
        auth=_parse_auth(raw["auth"]) if "auth" in raw else None,
        forwarded_allow_ips=str(raw.get("forwarded_allow_ips", "")).strip(),
        chat=not raw.get("no_chat", False), image=not raw.get("no_image", False),
        warmup_order=tuple(p.strip().lower() for p in str(raw.get("warmup_order", "chat,image")).split(",")
                           if p.strip()),
        queue_size=as_int("queue-size", raw.get("queue_size", 16)),
        max_session_jobs=as_int("max-session-jobs", raw.get("max_session_jobs", 2)),
        max_file_size=as_int("max-file-size", raw.get("max_file_size", 64 * 2**20)),
        max_request_bytes=as_int("max-request-bytes", raw.get("max_request_bytes", 8 * 2**20)),
        max_prompt_chars=as_int("max-prompt-chars", raw.get("max_prompt_chars", 20_000)),
        max_history_messages=as_int("max-history-messages", raw.get("max_history_messages", 200)),
        max_history_chars=as_int("max-history-chars", raw.get("max_history_chars", 100_000)),
        max_saved_images=as_int("max-saved-images", raw.get("max_saved_images", 200)),
        image_preview=not raw.get("no_image_preview", False),
        max_images_per_run=as_int("max-images-per-run", raw.get("max_images_per_run", 4)),
        hub_timeout=as_float("hub-timeout", raw.get("hub_timeout", 5.0)),
        rank=as_int("tp", env.get("RANK", 0)),  # torchrun sets RANK, LOCAL_RANK and WORLD_SIZE for each process
        local_rank=as_int("tp", env.get("LOCAL_RANK", 0)), world_size=as_int("tp", env.get("WORLD_SIZE", 1)),
        exported_visible_cores=env.get("NEURON_RT_VISIBLE_CORES") or None,
        options={key: value for key, value in raw.items() if key not in core},
    )
    return validate(settings)


def _resolve_models(requested, models, raw, weights_available) -> tuple[str, str]:
    """Turn auto|full|tiny into full|tiny with a reason that the log and the UI show.

    ``models``: (model, revision) of chat and image; the injected ``weights_available`` hears the model only.
    """
    if requested == "tiny":
        return "tiny", tr("asked for the demo models (--models tiny)")
    if requested == "full":
        return "full", tr("asked for the real models (--models full)")
    if weights_available is None:  # every needed file cached, or the Hub reachable (weights.py)
        from .weights import weights_available as probe  # local import: touches huggingface_hub
    timeout = as_float("hub-timeout", raw.get("hub_timeout", 5.0))
    # an engine that a plug-in runs on other servers (its --chat-server, --image-server) needs no weights here
    local = {e: not (raw.get(f"no_{e}") or raw.get(f"{e}_server")) for e in ("chat", "image")}
    wanted = [(m, rev, kind) for (m, rev), kind in ((models[0], "chat"), (models[1], "image")) if local[kind]]
    for model, revision, kind in wanted:
        ok, why = probe(model, timeout, kind, revision) if weights_available is None else \
            weights_available(model, timeout)
        if not ok:
            return "tiny", tr("--models auto: {why}; using the offline demo models with random weights", why=why)
    return "full", tr("--models auto: the real model weights are available")


def validate(s: Settings) -> Settings:
    """Check every setting; raise ConfigError naming the flag and the allowed values."""
    for flag, value in (("--device", s.device), ("--chat-device", s.chat_device), ("--image-device", s.image_device)):
        if value is not None and not _DEVICE_RE.match(value):
            raise ConfigError(flag, f"unknown device {value!r}", "auto, neuron, cuda, cpu, optionally with :N")
    # --references: 0 included, each count in range, every size's references kept unchanged by the pipeline
    s = dataclasses.replace(s, references=served_counts(s.references, s.sizes, s.references_set))
    if s.context_length < 2:
        raise ConfigError("--context-length", f"{s.context_length} is too small", "a whole number of 2 or more")
    if s.buckets[0] < 1:
        raise ConfigError("--chat-buckets", f"bucket {s.buckets[0]} is not positive", "whole numbers of 1 or more")
    if s.buckets[-1] >= s.context_length:
        raise ConfigError(
            "--chat-buckets",
            f"bucket {s.buckets[-1]} leaves no room for new tokens in --context-length {s.context_length}",
            f"buckets smaller than {s.context_length}",
        )
    for window in s.cache_windows:
        if not 1 <= window <= s.context_length:
            raise ConfigError("--cache-windows", f"window {window} is outside 1..{s.context_length}",
                              f"token counts up to --context-length {s.context_length}, or 'none'")
    if s.prefill_chunk is not None and s.prefill_chunk < 0:
        raise ConfigError("--prefill-chunk", f"{s.prefill_chunk} is negative", "tokens per chunk, auto, or 0 (eager)")
    uneven = [b for b in s.buckets if s.prefill_chunk and b % s.prefill_chunk]
    if uneven:  # a shorter last chunk would be one more graph per bucket
        raise ConfigError("--prefill-chunk", f"{s.prefill_chunk} does not divide bucket {uneven[0]} of --chat-buckets",
                          f"a divisor of every bucket, e.g. {math.gcd(*s.buckets)} (auto), or 0 for eager prefill")
    if s.max_new_tokens < 1:
        raise ConfigError("--max-new-tokens", f"{s.max_new_tokens} is not positive", "1 or more")
    if not 1 <= s.max_steps <= 1000:
        raise ConfigError("--max-steps", f"{s.max_steps} is out of range", "1 to 1000")
    if not 1 <= s.default_steps <= s.max_steps:
        raise ConfigError("--default-steps", f"{s.default_steps} is out of range", f"1 to --max-steps ({s.max_steps})")
    if not 0 <= s.port <= 65535:
        raise ConfigError("--port", f"{s.port} is out of range", "0 to 65535")
    for flag, value in (("--queue-size", s.queue_size), ("--max-session-jobs", s.max_session_jobs),
                        ("--max-prompt-chars", s.max_prompt_chars)):
        if value < 1:
            raise ConfigError(flag, f"{value} is not positive", "1 or more")
    for flag, value in (("--max-file-size", s.max_file_size), ("--max-request-bytes", s.max_request_bytes)):
        if value < 65536:
            raise ConfigError(flag, f"{value} is too small", "65536 (64 KiB) or more")
    for flag, value in (("--max-history-messages", s.max_history_messages),
                        ("--max-history-chars", s.max_history_chars), ("--max-saved-images", s.max_saved_images)):
        if value < 0:
            raise ConfigError(flag, f"{value} is negative", "0 or more")
    if not 1 <= s.max_images_per_run <= 16:
        raise ConfigError("--max-images-per-run", f"{s.max_images_per_run} is out of range", "1 to 16")
    if not 0 <= s.compile_timeout_min <= 7 * 24 * 60:
        raise ConfigError("--compile-timeout-min", f"{s.compile_timeout_min} is out of range", "0 (no limit) to 10080")
    if s.hub_timeout <= 0:
        raise ConfigError("--hub-timeout", f"{s.hub_timeout} is not positive", "seconds above 0")
    unknown = [e for e in s.warmup_order if e not in ("chat", "image")]
    if unknown or len(set(s.warmup_order)) != len(s.warmup_order) or not s.warmup_order:
        raise ConfigError("--warmup-order", f"invalid order {','.join(s.warmup_order)!r}", "chat,image or image,chat")
    if s.compile_repeated_blocks == "on" and s.compile == "off":
        raise ConfigError("--compile-repeated-blocks", "needs compiling, but --compile is off", "--compile on|auto")
    if not s.chat and not s.image:
        raise ConfigError("--no-chat/--no-image", "both engines are disabled", "disable at most one engine")
    return s
