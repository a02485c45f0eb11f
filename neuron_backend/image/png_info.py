"""Generated PNGs with their parameters embedded, the bounded folder they are saved in, and paste-back (an image's
settings read from its PNG's text chunks, checked against this server; at the end).

Each PNG carries A1111-style infotext (``parameters``), which other tools read, and the full parameters as
JSON (``showcase``), which ``read_png_parameters`` returns.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import struct
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from ..errors import InvalidRequestError, UnsupportedSizeError, storage_reason
from ..messages import Message, tr
from ..settings import Settings
from ..shapes import MAX_REFERENCES, parse_size
from .inputs import GUIDANCE_MAX, GUIDANCE_MIN, clean_prompt
from .references import FIT_MODES

log = logging.getLogger("showcase.image")

INFOTEXT_KEY = "parameters"
JSON_KEY = "showcase"
# zlib level 1 with run-length matching: on a photo-like 1024x1024 image Pillow's default (level 6)
# took 550 ms and 1.43 MB, this 101 ms and 1.41 MB; on 256x256 noise 9.2 ms against 6.4 ms.
PNG_SAVE_OPTIONS = {"compress_level": 1, "compress_type": zlib.Z_RLE}
# Saved files are named "<date>-<time>-<ms>-<stem>.png"; only names like that are ever pruned.
_SAVED_NAME = re.compile(r"^\d{8}-\d{6}-\d{3}-[\w.-]+\.png$")
# The longest settings line ("Steps: 4, Sampler: ..., Seed: 42, ...") that is parsed. Ours are
# ~300 characters; A1111 lines with many extension fields (LoRA and TI hashes, ADetailer) a few KB.
MAX_SETTINGS_CHARS = 16_384
# Pieces of the settings-line scanner (``settings_pairs``): each is one flat character-class run,
# matched once at a known position, so it costs time linear in what it consumes.
_SPACES = re.compile(r"\s*")
_KEY = re.compile(r"\w[\w \-/()]*")
_WORD = re.compile(r"\w")
_QUOTE_OR_BACKSLASH = re.compile(r'["\\]')
_BACKSLASHES = re.compile(r"\\+")


def _quote(value: object) -> str:
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if any(c in text for c in ',:\n"') else text


def infotext(params: dict) -> str:
    """A1111-style text: the prompt, then one line of ``Key: value`` pairs."""
    pairs = [("Steps", params.get("steps")), ("Sampler", params.get("sampler"))]
    if params.get("guidance") is not None:
        pairs.append(("CFG scale", params["guidance"]))
    pairs += [
        ("Seed", params.get("seed")),
        ("Size", params.get("size")),
        ("Model", params.get("model")),
        ("Device", params.get("device")),
        ("Dtype", params.get("dtype")),
        ("Mode", params.get("mode")),
        ("Seconds", params.get("seconds")),
    ]
    if params.get("prompt_truncated"):
        pairs.append(("Prompt truncated", f"to {params.get('max_sequence_length')} tokens"))
    if params.get("stopped"):
        pairs.append(("Stopped at step", f"{params.get('steps_done')}/{params.get('steps')}"))
    if params.get("references"):  # an edit: each reference by fit mode, sha256 prefix and sizes
        pairs.append(("References", "; ".join(f"{r.get('fit')} {str(r.get('sha256'))[:12]} {r.get('original_size')}"
                                              f"->{r.get('fitted_size')}" for r in params["references"])))
    pairs += [(name.capitalize(), version) for name, version in params.get("versions", {}).items()]
    line = ", ".join(f"{key}: {_quote(value)}" for key, value in pairs if value is not None)
    return f"{params.get('prompt', '')}\n{line}"


def parse_infotext(text: str) -> dict:
    """Best-effort inverse of ``infotext``: {"prompt": ..., "<Key>": "<value>", ...}, values as text.

    A settings line over ``MAX_SETTINGS_CHARS`` is not parsed: the whole text is the prompt."""
    prompt, _, line = text.rpartition("\n")
    if not line.startswith("Steps:"):
        return {"prompt": text}
    if len(line) > MAX_SETTINGS_CHARS:
        log.warning("settings line of %d characters not parsed (at most %d)", len(line), MAX_SETTINGS_CHARS)
        return {"prompt": text}
    result: dict[str, str] = {"prompt": prompt}
    for key, value in settings_pairs(line):
        result[key.strip()] = _quoted(value) if value.startswith('"') else value.strip()
    return result


def _quoted(value: str) -> str:
    """A quoted infotext value as its text; a broken quote (a file from elsewhere) as the text inside it."""
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value.strip('"')


def settings_pairs(line: str) -> list[tuple[str, str]]:
    """The raw ``(key, value)`` pairs of one settings line, ``Key: value, Key: "quoted, value", ...`` (a quoted value
    keeps its quotes when a ``,`` or the end follows them): the former pattern's pairs in linear time
    (docs/security.md, "Untrusted PNG text")."""
    pairs: list[tuple[str, str]] = []
    end = len(line)
    pos = 0
    while pos < end:
        start = _SPACES.match(line, pos).end()
        key = _KEY.match(line, start)
        if key is None:
            # No word character after the spaces. A start before the next word character either fails
            # too or skips spaces up to it, so that word character is the next start worth trying.
            word = _WORD.search(line, start + 1)
            pos = end if word is None else word.start()
            continue
        colon = key.end()
        if colon == end or line[colon] != ":":
            # A start anywhere inside this run reaches the same end and fails the same way.
            pos = colon
            continue
        value_at = _SPACES.match(line, colon + 1).end()
        value, pos = _value(line, value_at)
        pairs.append((key.group(), value))
    return pairs


def _value(line: str, at: int) -> tuple[str, int]:
    """The raw value starting at ``at`` and where the next pair may start (after its ``,``)."""
    end = len(line)
    if at < end and line[at] == '"':
        # A search for the closing quote stops at the latest at the next quoted value's opening
        # quote (the ':' and spaces before it cannot be escaped), so searches never overlap.
        closing = _closing_quote(line, at + 1)
        after = closing + 1
        if closing >= 0:
            if after < end and line[after] == ",":
                return line[at:after], after + 1
            if after == end or (after == end - 1 and line[after] == "\n"):  # what ``$`` matches
                return line[at:after], after
    comma = line.find(",", at)
    return (line[at:], end) if comma < 0 else (line[at:comma], comma + 1)


def _closing_quote(line: str, at: int) -> int:
    """The index of the quote that closes a string whose body starts at ``at``, or -1.

    A backslash escapes the next character unless that is a newline or the end of the line."""
    while True:
        found = _QUOTE_OR_BACKSLASH.search(line, at)
        if found is None:
            return -1
        index = found.start()
        if line[index] == '"':
            return index
        run = _BACKSLASHES.match(line, index).end()
        if (run - index) % 2 == 0:  # backslashes escaping each other
            at = run
        elif run == len(line) or line[run] == "\n":  # the last one escapes nothing
            return -1
        else:
            at = run + 1


def png_bytes(image: Image.Image, params: dict) -> bytes:
    """``image`` as PNG bytes with ``params`` embedded, the way ``OutputFolder`` saves it."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=png_metadata(params), **PNG_SAVE_OPTIONS)
    return buffer.getvalue()


def png_metadata(params: dict) -> PngInfo:
    """The two text chunks (infotext and JSON) for ``Image.save(..., pnginfo=...)``."""
    info = PngInfo()
    info.add_text(INFOTEXT_KEY, infotext(params))  # tEXt, or iTXt when the prompt is not latin-1
    info.add_text(JSON_KEY, json.dumps(params, ensure_ascii=True, default=str), zip=True)
    return info


def saved_json(chunks: dict[str, str]) -> dict | None:
    """The JSON object this app saved in a PNG's text chunks; None when absent or not a JSON object."""
    try:
        saved = json.loads(chunks[JSON_KEY]) if JSON_KEY in chunks else None
    except (ValueError, RecursionError):  # not JSON, an integer over 4300 digits, nested too deep
        return None
    return saved if isinstance(saved, dict) else None


def read_png_parameters(path: str | Path) -> dict:
    """The parameters saved in a PNG: the JSON chunk (when it is a JSON object), else the parsed infotext, else {}."""
    with Image.open(path) as image:
        chunks = dict(getattr(image, "text", {}) or {})
    saved = saved_json(chunks)
    if saved is not None:
        return saved
    if INFOTEXT_KEY in chunks:
        return parse_infotext(chunks[INFOTEXT_KEY])
    return {}


@dataclass(frozen=True)
class SaveOutcome:
    """Where the PNG went, or why it was not saved (the image itself is never lost)."""

    path: Path | None
    problem: Message | None = None  # English as a str; the page shows it in its language


class OutputFolder:
    """A folder of at most ``limit`` generated PNGs (0: saving off); the oldest go first. ``save`` is safe from
    several threads (one lock), writes under a temporary name then renames (no truncated PNG on a full disk),
    and returns a failure as ``SaveOutcome(None, problem)``, never raises."""

    def __init__(self, folder: Path, limit: int):
        self.folder = Path(folder)
        self.limit = limit
        self._lock = threading.Lock()

    def save(self, image: Image.Image, params: dict, stem: str) -> SaveOutcome:
        """Write ``image`` with ``params`` embedded; prune the folder down to ``limit`` files."""
        if self.limit <= 0:
            return SaveOutcome(None, tr("not saved: --max-saved-images is 0"))
        with self._lock:
            tmp = None
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                path = self._new_path(stem)
                tmp = self.folder / f".tmp-{uuid.uuid4().hex}.png"
                image.save(tmp, format="PNG", pnginfo=png_metadata(params), **PNG_SAVE_OPTIONS)
                os.replace(tmp, path)
            except OSError as exc:
                _remove_quietly(tmp)
                log.warning("could not save the image under %s: %s", self.folder, exc)  # the operator's details
                return SaveOutcome(None, tr("not saved: could not write to the images folder of the cache root "
                                            "({reason}). This reply is the only copy: download it to keep it.",
                                            reason=storage_reason(exc)))
            self._prune()
            return SaveOutcome(path)

    def saved_files(self) -> list[Path]:
        """Saved PNGs, oldest first."""
        try:
            files = [p for p in self.folder.iterdir() if _SAVED_NAME.match(p.name)]
        except OSError:
            return []
        return sorted(files, key=lambda p: (_mtime_ns(p), p.name))

    def _new_path(self, stem: str) -> Path:
        now = time.time()
        base = f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{int(now * 1000) % 1000:03d}-{stem}"
        path, n = self.folder / f"{base}.png", 1
        while path.exists():
            path, n = self.folder / f"{base}.{n}.png", n + 1
        return path

    def _prune(self) -> None:
        files = self.saved_files()
        for old in files[: max(0, len(files) - self.limit)]:
            try:
                old.unlink()
            except OSError as exc:  # the new image is saved; an undeletable old one is only logged
                log.warning("could not remove old image %s: %s", old, exc)


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _remove_quietly(path: Path | None) -> None:
    """Remove a half-written temporary file; the original write error is what gets reported."""
    if path is None:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


# ----- paste-back ---------------------------------------------------------------------------------------------
# Paste-back: the settings of an image, read from a PNG's text chunks (ours: the JSON ``showcase`` chunk, else
# the infotext; other tools': A1111-style infotext), checked like a request. The file is never trusted: bounded
# reads, text chunks only (no pixel is decompressed), nothing used as a path (docs/security.md).

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
