"""The command-line flags: one table (name, type, help), the argparse parser, and the value parsers.

Every flag also reads ``SHOWCASE_<FLAG>`` from the environment; ``settings.parse_settings`` turns
the raw values into the one ``Settings`` object.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from .errors import ConfigError, InvalidRequestError
from .shapes import ImageSize, parse_size

ENV_PREFIX = "SHOWCASE_"

# name, type, help; the env var is SHOWCASE_<NAME upper, dashes as underscores>.
_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("models", "str", "auto|full|tiny: real models, offline demo models, or full where available"),
    ("chat-model", "str", "chat model: hub id or local folder"),
    ("image-model", "str", "image model: hub id or local folder"),
    ("device", "str", "auto|neuron|cuda|cpu (optionally :N) for both engines"),
    ("chat-device", "str", "device of the chat engine, e.g. neuron:0"),
    ("image-device", "str", "device of the image engine, e.g. neuron:1"),
    ("dtype", "str", "auto|bfloat16|float16|float32 (auto: bfloat16 on accelerators, float32 on CPU)"),
    ("sizes", "str", "comma-separated precompiled image sizes WxH"),
    ("chat-buckets", "str", "comma-separated prompt length buckets in tokens"),
    ("context-length", "int", "fixed KV-cache length in tokens"),
    ("cache-windows", "str", "comma-separated KV-cache windows in tokens (one decode graph each; 'none': only "
                             "the whole cache); a step attends over the smallest window that holds the text so far"),
    ("max-new-tokens", "int", "most tokens one reply may generate"),
    ("chat-batch", "int", "chat replies generated together in one fixed batch of N slots (1: one at a time)"),
    ("prefill-chunk", "str", "N|auto|0: with compile on, the prompt runs through the compiled forward in "
                             "chunks of N tokens, which must divide every bucket (auto: the largest such N; "
                             "0 or off: eager prefill)"),
    ("default-steps", "int", "default denoising steps"),
    ("max-steps", "int", "most denoising steps one request may ask for"),
    ("compile", "str", "auto|on|off: torch.compile (auto: on for neuron, off elsewhere)"),
    ("compile-repeated-blocks", "bool", "compile each repeated transformer block once (faster compile)"),
    ("cache-dir", "str", "root folder for compile caches, timing history, demo models, outputs"),
    ("host", "str", "address to bind (default 127.0.0.1; a Space sets GRADIO_SERVER_NAME)"),
    ("port", "int", "port to listen on"),
    ("share", "bool", "create a public Gradio share link"),
    ("auth", "str", "user:password protecting the UI and the API"),
    ("mcp", "bool", "also serve the chat, image and warm-up status tools over MCP at /gradio_api/mcp/"),
    ("feedback-max-bytes", "int", "size of the feedback file (chat 👍/👎 marks) before it is rotated; "
                           "4 rotations are kept, then marks are refused"),
    ("no-chat", "bool", "disable the chat engine"),
    ("no-image", "bool", "disable the image engine"),
    ("warmup-order", "str", "comma-separated engine order for warm-up, e.g. image,chat"),
    ("queue-size", "int", "most requests waiting in the queue before 'busy, try again'"),
    ("max-prompt-chars", "int", "longest accepted prompt in characters"),
    ("max-history-messages", "int", "most chat history messages one request may carry (refused above)"),
    ("max-history-chars", "int", "most characters of chat history one request may carry (refused above)"),
    ("max-saved-images", "int", "images kept under the cache root; the oldest are removed"),
    ("no-image-preview", "bool", "no live preview while an image denoises (on by default; host-side, no compile)"),
    ("max-images-per-run", "int", "most images one Image-tab run may ask for (consecutive seeds, one after another)"),
    ("hub-timeout", "float", "seconds to wait for the Hugging Face Hub when --models auto"),
    ("tp", "int", "shard one engine over N cores (tensor parallel); launch with torchrun --nproc_per_node=N"),
    ("tp-engine", "str", "chat|image: the engine --tp shards (default chat; image: the FLUX.2 transformer)"),
    ("doctor", "bool", "print a first-run checklist of this host (pass/fail/skipped, each with the fix) and exit; "
                       "also python -m neuron_backend.doctor"),
    ("cache-bundle", "str", "compile-cache bundle to install at start: a .tar file, a folder holding one, or "
                            "hf://owner/repo[@revision] (see python -m neuron_backend.cache)"),
)


def env_name(flag: str) -> str:
    """The environment variable matching ``--flag``."""
    return ENV_PREFIX + flag.upper().replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for every flag (defaults are None: presets fill them later)."""
    parser = argparse.ArgumentParser(
        prog="app.py",
        description="Hugging Face models on AWS Trainium: chat and image demo.",
        epilog=f"Every flag can also be set as an environment variable {ENV_PREFIX}<FLAG>, "
        f"e.g. {env_name('models')}=tiny.",
    )
    for name, kind, help_text in _FLAGS:
        help_text = f"{help_text} [env {env_name(name)}]"
        if kind == "bool":
            parser.add_argument(f"--{name}", action="store_const", const=True, default=None, help=help_text)
        else:
            parser.add_argument(f"--{name}", default=None, help=help_text)
    return parser


def _raw_values(argv: Sequence[str] | None, env: Mapping[str, str]) -> dict[str, object]:
    """Flag values by field name, flags first, then SHOWCASE_* environment variables."""
    args = vars(build_parser().parse_args(argv))
    raw: dict[str, object] = {}
    for name, kind, _ in _FLAGS:
        key = name.replace("-", "_")
        value = args.get(key)
        if value is None and env.get(env_name(name), "") != "":
            value = env[env_name(name)]
            if kind == "bool":
                value = _parse_bool(name, str(value))
        if value is not None:
            raw[key] = value
    return raw


def _parse_bool(flag: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(env_name(flag), f"{text!r} is not a boolean", "1/0, true/false, yes/no, on/off")


def _as_int(flag: str, value: object) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"--{flag}", f"{value!r} is not a whole number") from None


def _as_float(flag: str, value: object) -> float:
    try:
        return float(str(value).strip())
    except ValueError:
        raise ConfigError(f"--{flag}", f"{value!r} is not a number") from None


def _choice(flag: str, value: object, choices: Sequence[str]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ConfigError(f"--{flag}", f"unknown value {value!r}", "|".join(choices))
    return text


def _parse_sizes(value: object) -> tuple[ImageSize, ...]:
    sizes = []
    for part in str(value).split(","):
        if not part.strip():
            continue
        try:
            sizes.append(parse_size(part))
        except InvalidRequestError as exc:
            raise ConfigError("--sizes", str(exc), "WxH, multiples of 16, e.g. 1024x1024,1344x768") from None
    if not sizes:
        raise ConfigError("--sizes", "no size given", "WxH, multiples of 16, e.g. 1024x1024")
    return tuple(dict.fromkeys(sizes))


def _parse_windows(value: object) -> tuple[int, ...]:
    if str(value).strip().lower() in ("", "none"):
        return ()
    return tuple(sorted({_as_int("cache-windows", p) for p in str(value).split(",") if p.strip()}))


def _parse_prefill_chunk(value: object) -> int | None:
    """None: auto (the largest chunk that divides every bucket); 0: eager prefill."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    return 0 if text == "off" else _as_int("prefill-chunk", text)


def _parse_buckets(value: object) -> tuple[int, ...]:
    parts = [p for p in str(value).split(",") if p.strip()]
    buckets = sorted({_as_int("chat-buckets", p) for p in parts})
    if not buckets:
        raise ConfigError("--chat-buckets", "no bucket given", "comma-separated token counts, e.g. 256,1024")
    return tuple(buckets)


def _parse_auth(value: object) -> tuple[str, str]:
    user, sep, password = str(value).partition(":")
    if not sep or not user or not password:
        raise ConfigError("--auth", "expected user:password", "a non-empty user and password separated by ':'")
    return user, password


def _parse_list(value: object) -> tuple[str, ...]:
    return tuple(p.strip().lower() for p in str(value).split(",") if p.strip())


def _optional_lower(value: object) -> str | None:
    return None if value is None else str(value).strip().lower()


