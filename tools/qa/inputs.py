"""QA bench input: a prompt set (pasted lines, .jsonl or .csv) and named settings variants.

Everything here is user-supplied text, so every problem becomes an ``InvalidRequestError`` (or
``UnsupportedSizeError``) whose message names the row, column or variant and what is allowed.
Values are checked against the server's Settings (sizes, step and token limits) up front, so a bad
set fails before anything runs instead of as a grid of failed cells.
"""

from __future__ import annotations

import csv
import io
import json
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from neuron_backend.errors import InvalidRequestError, UnsupportedSizeError
from neuron_backend.image.inputs import GUIDANCE_MAX, GUIDANCE_MIN
from neuron_backend.messages import tr
from neuron_backend.settings import Settings
from neuron_backend.shapes import parse_size

from .expect import CHECKS, parse_check
from .references import COLUMNS as REFERENCE_COLUMNS
from .references import RowReference, row_references

MAX_PROMPTS = 100  # prompts in one set; a parameter of parse_prompt_set for servers that want another limit
MAX_VARIANTS = 6  # e.g. seeds 1..3 x thinking on/off
MAX_FILE_BYTES = 5_000_000
MAX_NAME_CHARS = 40
SEED_MAX = 2**32 - 1
FILE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".txt": "lines"}

# setting -> (cell kind it applies to: chat, image or both, value type)
SETTINGS: dict[str, tuple[str, str]] = {
    "seed": ("both", "int"),
    "system_prompt": ("chat", "text"),
    "thinking": ("chat", "bool"),
    "greedy": ("chat", "bool"),
    "temperature": ("chat", "float"),
    "top_p": ("chat", "float"),
    "top_k": ("chat", "int"),
    "max_new_tokens": ("chat", "int"),
    "size": ("image", "size"),
    "steps": ("image", "int"),
    "guidance": ("image", "float"),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_NAME = re.compile(r"^\s*(?:(?P<name>[^=:]+?)\s*:)?\s*(?P<body>.*?)\s*$")
# key=value, where value is a JSON string ("a, b") or runs to the next comma
_PAIR = re.compile(r'\s*(?P<key>\w+)\s*=\s*(?P<value>"(?:\\.|[^"\\])*"|[^,]*?)\s*(?:,|$)')
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass
class PromptRow:
    """One prompt of the set with the settings its file row gave (only those set)."""

    prompt: str
    settings: dict = field(default_factory=dict)
    expect: dict = field(default_factory=dict)  # checks of its cells' output (see expect.py)
    references: list[RowReference] = field(default_factory=list)  # images its image cells edit from


@dataclass
class Variant:
    """A named set of settings; every prompt runs once per variant."""

    name: str
    settings: dict = field(default_factory=dict)


def allowed_columns() -> str:
    return tr("prompt (required), {settings}; expectations: {checks}",
              settings=", ".join((*SETTINGS, *REFERENCE_COLUMNS)), checks=", ".join(CHECKS))


def shown(value: object, limit: int = 40) -> str:
    """A value as it appears in a message: its repr, cut to ``limit`` characters (a 5,000-digit seed is not echoed)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print (Python's 4,300-digit limit)
        return tr("a number that is far too long")
    return text if len(text) <= limit else text[:limit] + "…"


def check_text(value: str, what: str) -> str:  # what: a Message naming the text
    """``value`` unchanged if it can be stored and shown as UTF-8 text (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(tr("{what} contains a character that is not valid text (a lone surrogate); remove "
                                     "it.", what=what)) from None
    return value


def parse_prompt_set(text: str | None = None, file: str | Path | None = None, *, settings: Settings,
                     max_prompts: int = MAX_PROMPTS, uploads: Mapping[str, Path] | None = None) -> list[PromptRow]:
    """Prompts pasted one per line, or read from a .jsonl/.csv (``prompt`` column plus settings) or .txt file.

    A row's reference images are read from the file's folder, or, when ``uploads`` is given (the images
    uploaded with the file: file name -> path), looked up among those by file name.
    """
    has_text = bool(text and text.strip())
    if has_text and file:
        raise InvalidRequestError(tr("Give either pasted prompts or a file, not both: clear one of them."))
    if file:
        rows = _read_file(Path(file), settings, uploads)
    else:
        rows = [PromptRow(check_text(line.strip(), tr("A prompt"))) for line in (text or "").splitlines()
                if line.strip()]
    if not rows:
        raise InvalidRequestError(tr("The prompt set is empty: paste one prompt per line, or upload a .jsonl or a "
                                     ".csv file with a 'prompt' column."))
    if len(rows) > max_prompts:
        raise InvalidRequestError(tr("The prompt set has {count} prompts; at most {most} are allowed in one run. "
                                     "Split it into smaller sets.", count=len(rows), most=max_prompts))
    for number, row in enumerate(rows, 1):
        if len(row.prompt) > settings.max_prompt_chars:
            raise InvalidRequestError(tr("Prompt {number} is {chars} characters; at most {most} are allowed.",
                                         number=number, chars=len(row.prompt),
                                          most=settings.max_prompt_chars))
    return rows


def read_bounded_text(path: Path, max_bytes: int, too_big: str, unreadable: str) -> str:
    """A UTF-8 file's text (a BOM dropped), refused above ``max_bytes`` before anything is read.

    ``too_big`` and ``unreadable``: what to do, the end of each error (Messages, so they are translated too).
    """
    try:
        if path.stat().st_size > max_bytes:
            raise InvalidRequestError(tr("{name} is larger than {mb} MB{hint}",
                                         name=path.name, mb=max_bytes // 1_000_000,
                                          hint=too_big))
        return path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(tr("Could not read {name} ({detail}); {hint}", name=path.name, detail=str(exc),
                                      hint=unreadable)) from None


def _read_file(path: Path, settings: Settings, uploads: Mapping[str, Path] | None) -> list[PromptRow]:
    kind = FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise InvalidRequestError(tr("{name}: unsupported file type; upload a .jsonl, .csv or .txt file.",
                                     name=path.name))
    text = read_bounded_text(path, MAX_FILE_BYTES, tr("; upload a smaller prompt set."),
                             tr("upload a UTF-8 text file."))
    if kind == "lines":
        return [PromptRow(line.strip()) for line in text.splitlines() if line.strip()]
    records = _jsonl_records(path.name, text) if kind == "jsonl" else _csv_records(path.name, text)
    folder = path.parent if uploads is None else None
    return [_row_from_record(tr("{name} {where}", name=path.name, where=where), record, settings, folder, uploads)
            for where, record in records]


def _jsonl_records(name: str, text: str) -> list[tuple[str, dict]]:
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = tr("line {number}", number=number)
        record = load_json_line(line, tr("{name} {where}", name=name, where=where),
                                tr("each line must be an object like {{\"prompt\": \"...\"}}"))
        if not isinstance(record, dict):
            raise InvalidRequestError(tr("{where} must be a JSON object like {{\"prompt\": \"...\"}}.",
                                         where=tr("{name} {where}", name=name, where=where)))
        records.append((where, {str(k).strip().lower(): v for k, v in record.items() if v is not None}))
    return records


def load_json_line(line: str, where: str, hint: str) -> object:
    """One JSON value, with an error that names ``where`` (too deeply nested values included)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(tr("{where} is not valid JSON ({detail}); {hint}.",
                                     where=where, detail=exc.msg, hint=hint)) from None
    except RecursionError:
        raise InvalidRequestError(tr("{where} is nested too deeply to read; {hint}.", where=where, hint=hint)) from None


def _csv_records(name: str, text: str) -> list[tuple[str, dict]]:
    try:
        reader = csv.DictReader(io.StringIO(text))
        header = [str(h).strip().lower() for h in reader.fieldnames or []]
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:
            raise InvalidRequestError(tr("{name}: the header names {names} more than once; give each column once.",
                                         name=name, names=", ".join(map(repr, twice))))
        _check_columns(name, header)
        records = []
        for row in reader:
            if None in row:
                where = tr("{name} {where}", name=name, where=tr("row {number}", number=reader.line_num))
                raise InvalidRequestError(tr("{where} has more values than the header has columns; quote values that "
                                             "contain commas.", where=where))
            values = {h: v for h, v in zip(header, row.values(), strict=True) if v is not None and v.strip()}
            records.append((tr("row {number}", number=reader.line_num), values))
    except csv.Error as exc:
        raise InvalidRequestError(tr("Could not read {name} as CSV ({detail}).", name=name, detail=str(exc))) from None
    return records


def _check_columns(name: str, columns: list[str], need_prompt: bool = True) -> None:
    unknown = [c for c in columns if c != "prompt" and c not in SETTINGS and c not in CHECKS
               and c not in REFERENCE_COLUMNS]
    if unknown:
        raise InvalidRequestError(tr("{name}: unknown column(s) {columns}; allowed: {allowed}.",
                                     name=name, columns=", ".join(map(repr, unknown)),
                                      allowed=allowed_columns()))
    if need_prompt and "prompt" not in columns:
        raise InvalidRequestError(tr("{name} has no 'prompt' column; allowed: {allowed}.",
                                     name=name, allowed=allowed_columns()))


def _row_from_record(where: str, record: dict, settings: Settings, folder: Path | None,
                     uploads: Mapping[str, Path] | None = None) -> PromptRow:
    """A file's row; its references are read from ``folder``, or from ``uploads`` when given."""
    _check_columns(where, list(record), need_prompt=False)
    prompt = record.pop("prompt", None)
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequestError(tr("{where}: the prompt must be non-empty text.", where=where))
    check_text(prompt, tr("{where}: the prompt", where=where))
    values = {key: coerce_setting(key, value, settings, where) for key, value in record.items() if key in SETTINGS}
    expect = {key: parse_check(key, value, where) for key, value in record.items() if key in CHECKS}
    for text in (v for value in expect.values() for v in (value if isinstance(value, list) else [value])):
        if isinstance(text, str):
            check_text(text, tr("{where}: an expectation", where=where))
    references = row_references(where, record.get("references"), record.get("fit"), folder, settings, uploads)
    return PromptRow(prompt.strip(), values, expect, references)


def coerce_setting(key: str, value: object, settings: Settings, where: str) -> object:
    """Turn a JSON or text value into the setting's type and check its range against ``settings``."""
    if key not in SETTINGS:
        raise InvalidRequestError(tr("{where}: unknown setting {field!r}; allowed: {allowed}.",
                                     where=where, field=key, allowed=", ".join(SETTINGS)))
    kind = SETTINGS[key][1]
    text = value.strip() if isinstance(value, str) else None
    if text == "" and kind != "text":
        raise InvalidRequestError(tr("{where}: {field} has no value.", where=where, field=key))
    if kind == "size":
        try:
            size = parse_size(value)
        except InvalidRequestError as exc:
            raise InvalidRequestError(tr("{where}: {detail}", where=where, detail=exc)) from None
        if size not in settings.sizes:
            allowed = ", ".join(s.label for s in settings.sizes)
            raise UnsupportedSizeError(tr("{where}: size {size} is not one of this server's precompiled sizes; "
                                          "allowed: {allowed}.", where=where, size=size.label,
                                           allowed=allowed))
        return size.label
    if kind == "text":
        if not isinstance(value, str):
            raise InvalidRequestError(tr("{where}: {field} must be text, got {got}.",
                                         where=where, field=key, got=shown(value)))
        return check_text(_CONTROL.sub("", value), tr("{where}: {field}", where=where, field=key))
    if kind == "bool":
        return _as_bool(key, value, text, where)
    number = _as_number(key, value, text, kind, where)
    low, high = _range(key, settings)
    if not low <= number <= high or (key in ("temperature", "top_p") and number <= 0):
        allowed = (tr("above 0 and at most {high:g}", high=high) if key in ("temperature", "top_p")
                   else tr("from {low} to {high}", low=low, high=high))
        raise InvalidRequestError(tr("{where}: {field} must be {allowed}, got {got}.",
                                     where=where, field=key, allowed=allowed, got=shown(value)))
    return number


def _as_bool(key: str, value: object, text: str | None, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if text is not None and text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    raise InvalidRequestError(tr("{where}: {field} must be true or false, got {got}.",
                                 where=where, field=key, got=shown(value)))


def _as_number(key: str, value: object, text: str | None, kind: str, where: str) -> int | float:
    try:
        if text is not None:
            return int(text) if kind == "int" else float(text)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError
        if kind == "int":
            if not isinstance(value, numbers.Integral):
                raise ValueError
            return int(value)
        return float(value)
    except (ValueError, OverflowError):
        wanted = "{where}: {field} must be a whole number, got {got}." if kind == "int" else \
            "{where}: {field} must be a number, got {got}."
        raise InvalidRequestError(tr(wanted, where=where, field=key, got=shown(value))) from None


def _range(key: str, settings: Settings) -> tuple[float, float]:
    return {
        "seed": (0, SEED_MAX), "temperature": (0, 2.0), "top_p": (0, 1.0), "top_k": (0, 10_000),
        "max_new_tokens": (1, settings.max_new_tokens), "steps": (1, settings.max_steps),
        "guidance": (GUIDANCE_MIN, GUIDANCE_MAX),
    }[key]


def parse_variants(spec: str | list | dict | None, *, settings: Settings,
                   max_variants: int = MAX_VARIANTS) -> list[Variant]:
    """Named settings variants from text (one ``name: key=value, ...`` per line), JSON, or a list of dicts.

    No variants at all gives one variant named ``default`` with the server's defaults.
    """
    if isinstance(spec, str) and spec.strip()[:1] in ("[", "{"):
        spec = _variants_json(spec)
    if isinstance(spec, Mapping):
        spec = _variants_from_object(spec)
    if spec is None or isinstance(spec, str):
        raw = _variants_from_text(spec or "")
    elif isinstance(spec, list):
        raw = []
        for i, item in enumerate(spec, 1):
            if not isinstance(item, Mapping):
                raise InvalidRequestError(tr("{where} must be a JSON object like {{\"name\": \"cold\", "
                                             "\"temperature\": 0.2}}.", where=tr("Variant {number}",
                                                                                 number=i)))
            raw.append((str(item.get("name") or f"v{i}"),
                        {str(k).lower(): v for k, v in item.items() if k != "name" and v is not None}))
    else:
        raise InvalidRequestError(VARIANT_FORMS)
    if not raw:
        return [Variant("default")]
    if len(raw) > max_variants:
        raise InvalidRequestError(tr("{count} variants given; at most {most} run side by side.",
                                     count=len(raw), most=max_variants))
    variants = []
    for name, values in raw:
        name = check_text(_CONTROL.sub("", name).strip(), tr("A variant name"))
        if not name or len(name) > MAX_NAME_CHARS:
            raise InvalidRequestError(tr("Variant name {name!r} must be 1 to {most} characters.",
                                         name=name, most=MAX_NAME_CHARS))
        if any(v.name == name for v in variants):
            raise InvalidRequestError(tr("Two variants are named {name!r}; give each a different name.", name=name))
        where = tr("variant {name!r}", name=name)
        variants.append(Variant(name, {k: coerce_setting(str(k), v, settings, where) for k, v in values.items()}))
    return variants


VARIANT_FORMS = tr("Variants must be text (one 'name: key=value, ...' per line), or JSON: one object ({{\"name\": "
                   "\"cold\", \"temperature\": 0.2}}), a list of such objects, one object per line, or an object of "
                   "name -> settings ({{\"cold\": {{\"temperature\": 0.2}}}}).")


def _variants_json(text: str) -> object:
    """A JSON value, or one object per line (JSON lines); errors name the line."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidRequestError(tr("The variants are nested too deeply to read as JSON.")) from None
    except json.JSONDecodeError as whole:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(lines) < 2:
            raise InvalidRequestError(tr("Variants line {number} is not valid JSON ({detail}). {forms}",
                                         number=whole.lineno, detail=whole.msg,
                                          forms=VARIANT_FORMS)) from None
    items = []
    for number, line in lines:
        where = tr("Variants line {number}", number=number)
        item = load_json_line(line, where, tr("give one JSON object per line"))
        if not isinstance(item, Mapping):
            raise InvalidRequestError(tr("{where} must be a JSON object like {{\"name\": \"cold\", \"temperature\": "
                                         "0.2}}.", where=where))
        items.append({"name": f"v{len(items) + 1}", **item})
    return items


def _variants_from_object(spec: Mapping) -> list:
    """``{"cold": {...}, "hot": {...}}`` (name -> settings), else the object is one variant."""
    if spec and "name" not in spec and all(isinstance(v, Mapping) for v in spec.values()):
        return [{"name": name, **values} for name, values in spec.items()]
    return [dict(spec)] if spec else []


def _variants_from_text(text: str) -> list[tuple[str, dict]]:
    raw = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _NAME.match(line)
        body, values, pos = match["body"], {}, 0
        while pos < len(body):
            pair = _PAIR.match(body, pos)
            if pair is None or pair.end() == pos:
                raise InvalidRequestError(tr("Variant line {number} is not 'name: key=value, key=value' near "
                                             "{near!r}; quote values with "
                                             "commas: key=\"a, b\".", number=number, near=body[pos:pos + 30]))
            values[pair["key"].lower()] = _unquote(number, pair["value"])
            pos = pair.end()
        raw.append((match["name"] or body or f"v{number}", values))
    return raw


def _unquote(number: int, value: str) -> str:
    if not value.startswith('"'):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise InvalidRequestError(tr("Variant line {number}: {value} is not a valid quoted string.",
                                     number=number, value=value)) from None
