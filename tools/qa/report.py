"""QA bench JSONL export and import (exact round trip); HTML, CSV and compare live beside it.

JSONL layout: the first line is the run (``"type": "run"``: id, created, kind, run_seed, rows
with their expectations, variants, meta, ab); then one ``"type": "cell"`` line per cell with every
Cell field (the automatic verdict included) plus the prompt text for convenience (ignored on
import). ``import_jsonl(export_jsonl(run)) == run``. Version 1 files (no expectations, verdicts or
A/B) still import.

An imported file is hostile text from anywhere: it is bounded (``MAX_IMPORT_BYTES``; each image's
bytes and pixels, see images.py), and, given the server's Settings, held to the limits a prompt set
typed into the tab meets: prompts, variants, names, prompt length, every setting's range.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

from neuron_backend.errors import InvalidRequestError
from neuron_backend.image.references import check_reference_count
from neuron_backend.messages import Message, tr
from neuron_backend.settings import Settings

from . import ab as qa_ab
from .expect import CHECKS, parse_check
from .grid import grid_columns
from .images import check_png
from .inputs import (
    MAX_NAME_CHARS,
    MAX_PROMPTS,
    MAX_VARIANTS,
    SETTINGS,
    PromptRow,
    Variant,
    check_text,
    coerce_setting,
    load_json_line,
    read_bounded_text,
)
from .references import checked_entry, imported
from .runs import KINDS, MARKS, STATUSES, Cell, QARun

FORMAT, VERSION = "trainium-showcase-qa", 2
READS = (1, 2)
MAX_IMPORT_BYTES = 64_000_000
MAX_TEXT_CHARS = 200_000  # one cell's answer, reasoning, error or comment
_CHAT_FIELDS = {"system_prompt", "thinking", "greedy", "temperature", "top_p", "top_k", "max_new_tokens", "seed"}
_IMAGE_FIELDS = {"size", "steps", "seed", "guidance"}
_NEW_IN_2 = {"expect", "auto", "auto_reason", "ab"}  # may be missing from a version 1 file
_OPTIONAL = {"references"}  # a row's reference images: written only for rows that have some


# ----- export ----------------------------------------------------------------------------------------
def export_jsonl(run: QARun) -> str:
    """The whole run, marks, verdicts, A/B picks and images included, one JSON object per line."""
    head = {"type": "run", "format": FORMAT, "version": VERSION, **asdict(run)}
    head.pop("cells")
    for row in head["rows"]:  # each reference by name, sha256 and fit: never the folder it was read from
        references = row.pop("references")
        if references:
            row["references"] = [{k: v for k, v in ref.items() if k != "path"} for ref in references]
    lines = [json.dumps(head, ensure_ascii=False)]
    for index, cell in enumerate(run.cells):
        record = {"type": "cell", "index": index, "prompt": run.rows[cell.prompt_index].prompt, **asdict(cell)}
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + "\n"


# ----- import ----------------------------------------------------------------------------------------
def read_run(path: str | Path, settings: Settings | None = None) -> QARun:
    """Import a run from a .jsonl file written by ``export_jsonl`` (at most ``MAX_IMPORT_BYTES``)."""
    text = read_bounded_text(Path(path), MAX_IMPORT_BYTES, tr(", the most a QA run import may be."),
                             tr("upload a .jsonl exported by the QA tab."))
    return import_jsonl(text, settings)


def import_jsonl(text: str, settings: Settings | None = None) -> QARun:
    """Rebuild a run from ``export_jsonl`` output; every field is checked (InvalidRequestError says where).

    With ``settings``, the run must also fit this server: its sizes, step and token limits.
    """
    if len(text) > MAX_IMPORT_BYTES:
        raise InvalidRequestError(tr("The QA run is larger than {mb} MB.", mb=MAX_IMPORT_BYTES // 1_000_000))
    records = [(n, load_json_line(line, _line(n), tr("upload a .jsonl exported by the QA tab")))
               for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not records or not isinstance(records[0][1], dict) or records[0][1].get("format") != FORMAT:
        raise InvalidRequestError(tr("This is not a QA run export: its first line must be the run record with "
                                     "\"format\": \"{format}\".", format=FORMAT))
    head = records[0][1]
    if head.get("version") not in READS:
        raise InvalidRequestError(tr("QA run format version {version!r} is not supported (this app reads versions "
                                     "{reads}).", version=str(head.get("version"))[:20],
                                      reads=", ".join(map(str, READS))))
    run = _run_from(head, settings)
    if len(records) - 1 > len(run.rows) * len(grid_columns(run)):
        raise InvalidRequestError(tr("The QA run has {count} cells; its prompts and variants make {planned}.",
                                     count=len(records) - 1,
                                      planned=len(run.rows) * len(grid_columns(run))))
    for position, (number, record) in enumerate(records[1:]):
        run.cells.append(_cell_from(run, number, position, record, settings))
    _check_layout(run)
    if run.ab is not None:
        run.ab = qa_ab.checked(run, run.ab)
    return run


def _line(number: int) -> str:
    return tr("QA run line {number}", number=number)


def _fields(where: str, record: object, cls, extra: tuple[str, ...] = ()) -> dict:
    names = {f.name for f in fields(cls)}
    if not isinstance(record, dict):
        raise InvalidRequestError(tr("{where} must be a JSON object.", where=where))
    values = {k: v for k, v in record.items() if k not in extra}
    missing, unknown = names - set(values) - {"meta", "cells"} - _NEW_IN_2 - _OPTIONAL, set(values) - names
    if missing or unknown:
        raise InvalidRequestError(tr("{where}: missing fields {missing}, unknown fields {unknown}.",
                                     where=where, missing=str(sorted(missing)),
                                      unknown=str(sorted(map(str, unknown))[:10])))
    return values


def _expect(where: str, ok: bool, what: str) -> None:
    """Refuse with ``where: what.`` unless ``ok`` (``what``: a Message, or the key of one without parameters)."""
    if not ok:
        raise InvalidRequestError(tr("{where}: {what}.", where=where,
                                      what=what if isinstance(what, Message) else tr(what)))


_RUN = tr("QA run")


def _run_from(head: dict, settings: Settings | None) -> QARun:
    values = _fields(_line(1), head, QARun, ("type", "format", "version"))
    _expect(_RUN, values["kind"] in KINDS, "kind must be chat, image or both")
    _expect(_RUN, isinstance(values["run_seed"], int) and not isinstance(values["run_seed"], bool)
            and abs(values["run_seed"]) < 2**63, "run_seed must be a whole number")
    _expect(_RUN, all(isinstance(values[k], str) and len(values[k]) <= 100 for k in ("id", "created")),
            "id and created must be short text")
    meta = values.get("meta", {})
    _expect(_RUN, isinstance(meta, dict), "meta must be an object")
    _expect(_RUN, isinstance(meta.get("models", {}), dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.get("models", {}).items()),
        "meta.models must be an object of engine -> model name")
    for key in ("device",):
        _expect(_RUN, meta.get(key) is None or isinstance(meta.get(key), str), tr("meta.{field} must be text",
                                                                                  field=key))
    raw_rows, raw_variants = _list(values, "rows", MAX_PROMPTS), _list(values, "variants", MAX_VARIANTS)
    rows = [_row_from(i, r, settings) for i, r in enumerate(raw_rows, 1)]
    variants = [_variant_from(i, v, settings) for i, v in enumerate(raw_variants, 1)]
    names = [v.name for v in variants]
    twice = sorted({n for n in names if names.count(n) > 1})
    _expect(_RUN, not twice, tr("two variants are named {name!r}", name=twice[0]) if twice else "")
    return QARun(values["id"], values["created"], values["kind"], values["run_seed"], rows, variants, [], meta,
                 values.get("ab"))


def _list(values: dict, key: str, most: int) -> list:
    _expect(_RUN, isinstance(values[key], list) and values[key], tr("{field} must be a non-empty list", field=key))
    _expect(_RUN, len(values[key]) <= most, tr("{count} {field}; at most {most} are allowed in one run",
                                               count=len(values[key]), field=key, most=most))
    return values[key]


def _row_from(number: int, record: object, settings: Settings | None) -> PromptRow:
    where = tr("QA run prompt {number}", number=number)
    values = _fields(where, record, PromptRow)
    prompt = values["prompt"]
    _expect(where, isinstance(prompt, str) and prompt.strip(), "the prompt must be non-empty text")
    limit = settings.max_prompt_chars if settings else 20_000
    _expect(where, len(prompt) <= limit, tr("the prompt is {chars} characters; at most {most} are allowed",
                                            chars=len(prompt), most=limit))
    check_text(prompt, where)
    expect = values.get("expect", {})
    _expect(where, isinstance(expect, dict) and set(expect) <= set(CHECKS),
            tr("expect must be an object with keys among {keys}", keys=", ".join(CHECKS)))
    references = imported(where, values.get("references", []))
    if settings is not None and references:
        check_reference_count(len(references), settings.references)
    return PromptRow(prompt, _settings_from(where, values["settings"], settings),
                     {k: parse_check(k, v, where) for k, v in expect.items()}, references)


def _variant_from(number: int, record: object, settings: Settings | None) -> Variant:
    where = tr("QA run variant {name}", name=number)
    values = _fields(where, record, Variant)
    name = values["name"]
    _expect(where, isinstance(name, str) and 0 < len(name.strip()) <= MAX_NAME_CHARS,
            tr("the name must be 1 to {most} characters of text", most=MAX_NAME_CHARS))
    check_text(name, where)
    return Variant(name, _settings_from(tr("QA run variant {name}", name=repr(name)), values["settings"], settings))


def _settings_from(where: str, values: object, settings: Settings | None) -> dict:
    _expect(where, isinstance(values, dict) and set(values) <= set(SETTINGS),
            tr("settings must be an object with keys among {keys}", keys=", ".join(SETTINGS)))
    if settings is None:
        return values
    return {k: v if v is None else coerce_setting(k, v, settings, where) for k, v in values.items()}


def _cell_from(run: QARun, number: int, position: int, record: object, settings: Settings | None) -> Cell:
    where = _line(number)
    values = _fields(where, record, Cell, ("type", "index", "prompt"))
    _expect(where, record.get("type") == "cell" and record.get("index") == position,
            tr("expected cell {position}", position=position))
    _expect(where, values["status"] in STATUSES, tr("status must be one of {allowed}", allowed=", ".join(STATUSES)))
    _expect(where, values["mark"] in (None, *MARKS), "mark must be pass, fail or null")
    _expect(where, values.get("auto") in (None, *MARKS), "auto must be pass, fail or null")
    _expect(where, values["kind"] in ("chat", "image"), "kind must be chat or image")
    _expect(where, isinstance(values["settings"], dict) and set(values["settings"]) - _OPTIONAL ==
            (_CHAT_FIELDS if values["kind"] == "chat" else _IMAGE_FIELDS)
            and (values["kind"] == "image" or "references" not in values["settings"]),
            "settings do not match the cell's kind")
    for key in ("text", "reasoning", "image_path", "error"):
        _expect(where, values[key] is None or isinstance(values[key], str) and len(values[key]) <= MAX_TEXT_CHARS,
                tr("{field} must be text (at most {most} characters) or null", field=key, most=MAX_TEXT_CHARS))
    for key in ("comment", "auto_reason"):
        value = values.get(key, "")
        _expect(where, isinstance(value, str) and len(value) <= MAX_TEXT_CHARS, tr("{field} must be text", field=key))
    _expect(where, values["stats"] is None or isinstance(values["stats"], dict), "stats must be an object or null")
    _expect(where, values["seconds"] is None or isinstance(values["seconds"], (int, float))
            and not isinstance(values["seconds"], bool), "seconds must be a number or null")
    if "references" in values["settings"]:
        entries = values["settings"]["references"]
        _expect(where, isinstance(entries, list), "references must be a list")
        values["settings"]["references"] = [checked_entry(where, entry) for entry in entries]
    if settings is not None:
        values["settings"] = {k: v if v is None or k in _OPTIONAL else coerce_setting(k, v, settings, where)
                              for k, v in values["settings"].items()}
    if values["image_png"] is not None:
        _expect(where, values["kind"] == "image", "only image cells carry an image")
        check_png(values["image_png"], where, settings.sizes if settings else None)
    return Cell(**values)


def _check_layout(run: QARun) -> None:
    """Cells must be in planned order (prompt by prompt, then variant and engine), as the grid expects."""
    expected = [(p, v, k) for p in range(len(run.rows)) for v, k in grid_columns(run)]
    found = [(c.prompt_index, c.variant, c.kind) for c in run.cells]
    if found != expected:
        raise InvalidRequestError(tr("The QA run's cells do not match its prompts and variants: expected {expected} "
                                     "cells in prompt x variant order, "
                                     "found {found}.", expected=len(expected), found=len(found)))
    for index, cell in enumerate(run.cells):  # an image cell sends its row's references, no others
        entries = [ref.entry() for ref in run.rows[cell.prompt_index].references] if cell.kind == "image" else []
        _expect(tr("QA run cell {number}", number=index + 1), cell.settings.get("references", []) == entries
                and (bool(entries) or "references" not in cell.settings), "references do not match its prompt's")
