"""Generated PNGs with their parameters embedded, and the bounded folder they are saved in.

Each PNG carries A1111-style infotext (``parameters``), which other tools read, and the full parameters as
JSON (``showcase``), which ``read_png_parameters`` returns.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
import time
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from ..errors import storage_reason
from ..messages import Message, tr

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
