"""A PNG's settings read back from its text chunks: this app's JSON chunk (``showcase``), else the A1111-style
infotext (``parameters``) that this app and other tools write, checked against this server like a request.

The file is never trusted: bounded reads, text chunks only (no pixel is decompressed), a settings line parsed in
linear time and capped, nothing used as a path (docs/security.md, "Untrusted PNG text"). No Gradio here: the drop
box is ``drop_box.py``.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from neuron_backend.errors import InvalidRequestError, UnsupportedSizeError
from neuron_backend.image.inputs import GUIDANCE_MAX, GUIDANCE_MIN, clean_prompt
from neuron_backend.image.png_info import INFOTEXT_KEY, MAX_SETTINGS_CHARS, saved_json, settings_pairs
from neuron_backend.image.references import FIT_MODES
from neuron_backend.messages import Message, tr
from neuron_backend.settings import Settings
from neuron_backend.shapes import MAX_REFERENCES, parse_size

MAX_PNG_BYTES = 64 * 2**20  # a 1024x1024 PNG of ours is ~1.5 MB; other tools' are rarely over 20 MB
MAX_TEXT_BYTES = 2**20  # all text chunks together, after inflating
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SEED_MAX = 2**32 - 1
_TEXT_CHUNKS = (b"tEXt", b"zTXt", b"iTXt")
_INT = re.compile(r"^\s*-?\d{1,12}\s*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SIZE_TEXT = re.compile(r"^\d{1,5}x\d{1,5}$")
_NAME_CHARS = 80  # a reference's file name as a note shows it, at most


@dataclass(frozen=True)
class PastedSettings:
    """What an image was made with, as the Image tab's form takes it; ``notes`` say what was adjusted."""

    prompt: str
    size: str
    steps: int | None
    seed: int | None
    guidance: float | None
    source: str  # "showcase" (our JSON chunk), "infotext" (A1111-style text)
    notes: tuple[Message, ...] = ()
    # An edit's references as the PNG records them: {"name"?, "sha256", "original_size", "fitted_size", "fit"}
    references: tuple[dict, ...] = ()

    @property
    def fit(self) -> str | None:
        """The references' fit mode: one for all, or one per reference comma-separated; None without references."""
        fits = [r["fit"] for r in self.references]
        return None if not fits else fits[0] if len(set(fits)) == 1 else ",".join(fits)

    def as_row(self) -> dict:
        """A prompt-set row for the QA bench: {"prompt", "size", "steps", "seed", "guidance"} (None left out)."""
        row = {k: v for k, v in asdict(self).items() if k in ("prompt", "size", "steps", "seed", "guidance")}
        return {k: v for k, v in row.items() if v is not None}


def png_text_chunks(data: bytes) -> dict[str, str]:
    """The text chunks of PNG bytes, keyword -> text; refuses what is not a PNG."""
    if not data.startswith(PNG_SIGNATURE):
        raise InvalidRequestError(tr("This file is not a PNG: drop a PNG made by this app or another image tool."))
    chunks: dict[str, str] = {}
    budget = MAX_TEXT_BYTES
    at = len(PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        at += 12 + length  # length, type, data, CRC
        if kind == b"IEND" or len(body) < length:
            break
        if kind not in _TEXT_CHUNKS:
            continue  # pixels and everything else are skipped unread
        keyword, text = _decode_text_chunk(kind, body, budget)
        if keyword is not None:
            budget -= len(text.encode("utf-8"))
            chunks.setdefault(keyword, text)
        if budget <= 0:
            break
    return chunks


def _decode_text_chunk(kind: bytes, body: bytes, budget: int) -> tuple[str | None, str]:
    keyword, sep, rest = body.partition(b"\0")
    if not sep:
        return None, ""
    name = keyword.decode("latin-1")
    if kind == b"tEXt":
        return name, rest[:budget].decode("latin-1")
    if kind == b"zTXt":  # compression method byte, then zlib data
        return name, _inflate(rest[1:], budget).decode("latin-1")
    # iTXt: compression flag, method, language\0, translated keyword\0, text (UTF-8)
    if len(rest) < 2:
        return None, ""
    compressed, tail = rest[0], rest[2:]
    _, _, tail = tail.partition(b"\0")
    _, _, text = tail.partition(b"\0")
    raw = _inflate(text, budget) if compressed else text[:budget]
    return name, raw.decode("utf-8", errors="replace")


def _inflate(data: bytes, budget: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        return inflater.decompress(data, max(budget, 0))  # stops at the budget: no zip bomb
    except zlib.error:
        return b""


def parse_a1111(text: str) -> dict[str, str]:
    """A1111 infotext -> {"prompt", "negative_prompt", "<Key>": "<value>"}; {} when there is no settings line.

    Time linear in the length of ``text``; a settings line over ``MAX_SETTINGS_CHARS`` is refused."""
    lines = text.replace("\r\n", "\n").split("\n")
    settings_at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Steps:")), None)
    if settings_at is None:
        return {}
    if len(lines[settings_at]) > MAX_SETTINGS_CHARS:
        raise InvalidRequestError(tr("This PNG's settings line (the one starting 'Steps:') is {chars} characters "
                                     "long; at most {limit} characters are read.", chars=len(lines[settings_at]),
                                      limit=MAX_SETTINGS_CHARS))
    head = lines[:settings_at]
    negative_at = next((i for i, line in enumerate(head) if line.startswith("Negative prompt:")), len(head))
    out = {"prompt": "\n".join(head[:negative_at]).strip(),
           "negative_prompt": "\n".join(head[negative_at:]).removeprefix("Negative prompt:").strip()}
    for key, value in _pairs(lines[settings_at]):
        out.setdefault(key, value)
    return out


def _pairs(line: str):
    """``Key: value, Key: "quoted, value", ...`` in order."""
    for key, value in settings_pairs(line):
        key = key.strip()
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                value = value.strip('"')
        yield key, str(value).strip()


def read_settings(path: str | Path, settings: Settings) -> PastedSettings:
    """The form settings stored in the PNG at ``path``; refuses files too big, not PNG, without
    parameters, or whose size is not served here (the message lists the allowed sizes)."""
    path = Path(path)
    with open(path, "rb") as handle:
        data = handle.read(MAX_PNG_BYTES + 1)
    if len(data) > MAX_PNG_BYTES:
        raise InvalidRequestError(tr("This PNG is over {mb} MB; only smaller files are read.",
                                     mb=MAX_PNG_BYTES // 2**20))
    return settings_from_chunks(png_text_chunks(data), settings)


def settings_from_chunks(chunks: dict[str, str], settings: Settings) -> PastedSettings:
    """Check the parameters found in a PNG's text chunks against this server's settings."""
    raw, source = None, "infotext"
    loaded = saved_json(chunks)
    if loaded is not None:
        raw, source = {k: loaded.get(k) for k in ("prompt", "size", "steps", "seed", "guidance",
                                                  "references")}, "showcase"
    if raw is None and INFOTEXT_KEY in chunks:
        found = parse_a1111(chunks[INFOTEXT_KEY])
        if found:
            raw = {"prompt": found.get("prompt"), "size": found.get("Size"), "steps": found.get("Steps"),
                   "seed": found.get("Seed"), "guidance": found.get("CFG scale")}
    if raw is None:
        raise InvalidRequestError(tr("This PNG has no generation parameters (no 'parameters' or 'showcase' text): "
                                     "drop a PNG saved by this app or by an A1111-style tool."))
    return _checked(raw, source, settings)


def _checked(raw: dict, source: str, settings: Settings) -> PastedSettings:
    notes = []
    prompt = clean_prompt(raw.get("prompt") if isinstance(raw.get("prompt"), str) else "", settings.max_prompt_chars)
    allowed = ", ".join(s.label for s in settings.sizes)
    if raw.get("size") in (None, ""):
        raise UnsupportedSizeError(tr("This PNG does not say its size. Allowed sizes: {allowed}.", allowed=allowed))
    try:
        size = parse_size(str(raw["size"]))
    except InvalidRequestError as exc:
        raise UnsupportedSizeError(tr("{error} Allowed sizes: {allowed}.", error=exc, allowed=allowed)) from None
    if size not in settings.sizes:
        raise UnsupportedSizeError(tr("This image is {size}, which is not served here (each size is compiled ahead of "
                                      "time). Allowed sizes: {allowed}.", size=size.label, allowed=allowed))
    steps = _whole(raw.get("steps"))
    if steps is not None and not 1 <= steps <= settings.max_steps:
        raise InvalidRequestError(tr("This image used {steps} steps; this server allows 1 to {max_steps}.",
                                     steps=steps, max_steps=settings.max_steps))
    seed = _whole(raw.get("seed"))
    if seed is not None and not 0 <= seed <= SEED_MAX:
        notes.append(tr("seed {seed} is outside 0..{seed_max}: a random seed is used", seed=seed, seed_max=SEED_MAX))
        seed = None
    guidance = _number(raw.get("guidance"))
    if guidance is not None and not GUIDANCE_MIN <= guidance <= GUIDANCE_MAX:
        notes.append(tr("guidance {value} is outside {low}..{high}: the default is used",
                        value=guidance, low=GUIDANCE_MIN, high=GUIDANCE_MAX))
        guidance = None
    references = _references(raw.get("references"))
    if references:
        names = ", ".join(r.get("name") or f"{r['sha256'][:12]}… ({r['original_size']})" for r in references)
        notes.append(tr("edited from {count} reference images, which a PNG cannot carry: add them again ({names}; "
                        "sha256 in the parameters)", count=len(references), names=names))
        if len(references) not in settings.references:
            notes.append(tr("this server edits with {allowed} reference images, not {count}",
                            allowed=", ".join(str(n) for n in settings.references), count=len(references)))
    return PastedSettings(prompt, size.label, steps, seed, guidance, source, tuple(notes), references)


def _references(value: object) -> tuple[dict, ...]:
    """The references a PNG records, each entry checked field by field; anything malformed is left out."""
    if not isinstance(value, list) or len(value) > MAX_REFERENCES * 4:
        return ()
    kept = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or not _SHA256.match(entry["sha256"]) or entry.get("fit") not in FIT_MODES:
            continue
        sizes = [entry.get(k) for k in ("original_size", "fitted_size")]
        if not all(isinstance(v, str) and _SIZE_TEXT.match(v) for v in sizes):
            continue
        reference = {"sha256": entry["sha256"], "original_size": sizes[0], "fitted_size": sizes[1],
                     "fit": entry["fit"]}
        name = entry.get("name")
        if isinstance(name, str) and name.strip() and name.isprintable():
            reference["name"] = name.strip()[:_NAME_CHARS]
        kept.append(reference)
    return tuple(kept)


def _whole(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT.match(value):
        return int(value)
    return None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None
