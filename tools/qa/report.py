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
from neuron_backend.messages import Message, msg
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
from .runs import KINDS, MARKS, STATUSES, Cell, QARun

FORMAT, VERSION = "trainium-showcase-qa", 2
READS = (1, 2)
MAX_IMPORT_BYTES = 64_000_000
MAX_TEXT_CHARS = 200_000  # one cell's answer, reasoning, error or comment
_CHAT_FIELDS = {"system_prompt", "thinking", "greedy", "temperature", "top_p", "top_k", "max_new_tokens", "seed"}
_IMAGE_FIELDS = {"size", "steps", "seed", "guidance"}
_NEW_IN_2 = {"expect", "auto", "auto_reason", "ab"}  # may be missing from a version 1 file


# ----- export ----------------------------------------------------------------------------------------
def export_jsonl(run: QARun) -> str:
    """The whole run, marks, verdicts, A/B picks and images included, one JSON object per line."""
    head = {"type": "run", "format": FORMAT, "version": VERSION, **asdict(run)}
    head.pop("cells")
    lines = [json.dumps(head, ensure_ascii=False)]
    for index, cell in enumerate(run.cells):
        record = {"type": "cell", "index": index, "prompt": run.rows[cell.prompt_index].prompt, **asdict(cell)}
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + "\n"


# ----- import ----------------------------------------------------------------------------------------
def read_run(path: str | Path, settings: Settings | None = None) -> QARun:
    """Import a run from a .jsonl file written by ``export_jsonl`` (at most ``MAX_IMPORT_BYTES``)."""
    text = read_bounded_text(Path(path), MAX_IMPORT_BYTES, msg("err_qa_hint_import_limit"),
                             msg("err_qa_hint_import_file"))
    return import_jsonl(text, settings)


def import_jsonl(text: str, settings: Settings | None = None) -> QARun:
    """Rebuild a run from ``export_jsonl`` output; every field is checked (InvalidRequestError says where).

    With ``settings``, the run must also fit this server: its sizes, step and token limits.
    """
    if len(text) > MAX_IMPORT_BYTES:
        raise InvalidRequestError(msg("err_qa_import_too_big", mb=MAX_IMPORT_BYTES // 1_000_000))
    records = [(n, load_json_line(line, _line(n), msg("err_qa_hint_import_line")))
               for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not records or not isinstance(records[0][1], dict) or records[0][1].get("format") != FORMAT:
        raise InvalidRequestError(msg("err_qa_import_not_run", format=FORMAT))
    head = records[0][1]
    if head.get("version") not in READS:
        raise InvalidRequestError(msg("err_qa_import_version", version=str(head.get("version"))[:20],
                                      reads=", ".join(map(str, READS))))
    run = _run_from(head, settings)
    if len(records) - 1 > len(run.rows) * len(grid_columns(run)):
        raise InvalidRequestError(msg("err_qa_import_too_many_cells", count=len(records) - 1,
                                      planned=len(run.rows) * len(grid_columns(run))))
    for position, (number, record) in enumerate(records[1:]):
        run.cells.append(_cell_from(run, number, position, record, settings))
    _check_layout(run)
    if run.ab is not None:
        run.ab = qa_ab.checked(run, run.ab)
    return run


def _line(number: int) -> str:
    return msg("err_qa_where_run_line", number=number)


def _fields(where: str, record: object, cls, extra: tuple[str, ...] = ()) -> dict:
    names = {f.name for f in fields(cls)}
    if not isinstance(record, dict):
        raise InvalidRequestError(msg("err_qa_import_not_object", where=where))
    values = {k: v for k, v in record.items() if k not in extra}
    missing, unknown = names - set(values) - {"meta", "cells"} - _NEW_IN_2, set(values) - names
    if missing or unknown:
        raise InvalidRequestError(msg("err_qa_import_fields", where=where, missing=str(sorted(missing)),
                                      unknown=str(sorted(map(str, unknown))[:10])))
    return values


def _expect(where: str, ok: bool, what: str) -> None:
    """Refuse with ``where: what.`` unless ``ok`` (``what``: a Message, or the key of one without parameters)."""
    if not ok:
        raise InvalidRequestError(msg("err_qa_import_problem", where=where,
                                      what=what if isinstance(what, Message) else msg(what)))


_RUN = msg("err_qa_where_run")


def _run_from(head: dict, settings: Settings | None) -> QARun:
    values = _fields(_line(1), head, QARun, ("type", "format", "version"))
    _expect(_RUN, values["kind"] in KINDS, "err_qa_imp_kind")
    _expect(_RUN, isinstance(values["run_seed"], int) and not isinstance(values["run_seed"], bool)
            and abs(values["run_seed"]) < 2**63, "err_qa_imp_run_seed")
    _expect(_RUN, all(isinstance(values[k], str) and len(values[k]) <= 100 for k in ("id", "created")),
            "err_qa_imp_id")
    meta = values.get("meta", {})
    _expect(_RUN, isinstance(meta, dict), "err_qa_imp_meta")
    _expect(_RUN, isinstance(meta.get("models", {}), dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.get("models", {}).items()),
        "err_qa_imp_models")
    for key in ("device",):
        _expect(_RUN, meta.get(key) is None or isinstance(meta.get(key), str), msg("err_qa_imp_meta_text", field=key))
    raw_rows, raw_variants = _list(values, "rows", MAX_PROMPTS), _list(values, "variants", MAX_VARIANTS)
    rows = [_row_from(i, r, settings) for i, r in enumerate(raw_rows, 1)]
    variants = [_variant_from(i, v, settings) for i, v in enumerate(raw_variants, 1)]
    names = [v.name for v in variants]
    twice = sorted({n for n in names if names.count(n) > 1})
    _expect(_RUN, not twice, msg("err_qa_imp_variant_twice", name=twice[0]) if twice else "")
    return QARun(values["id"], values["created"], values["kind"], values["run_seed"], rows, variants, [], meta,
                 values.get("ab"))


def _list(values: dict, key: str, most: int) -> list:
    _expect(_RUN, isinstance(values[key], list) and values[key], msg("err_qa_imp_list", field=key))
    _expect(_RUN, len(values[key]) <= most, msg("err_qa_imp_list_long", count=len(values[key]), field=key, most=most))
    return values[key]


def _row_from(number: int, record: object, settings: Settings | None) -> PromptRow:
    where = msg("err_qa_where_run_prompt", number=number)
    values = _fields(where, record, PromptRow)
    prompt = values["prompt"]
    _expect(where, isinstance(prompt, str) and prompt.strip(), "err_qa_imp_prompt")
    limit = settings.max_prompt_chars if settings else 20_000
    _expect(where, len(prompt) <= limit, msg("err_qa_imp_prompt_long", chars=len(prompt), most=limit))
    check_text(prompt, where)
    expect = values.get("expect", {})
    _expect(where, isinstance(expect, dict) and set(expect) <= set(CHECKS),
            msg("err_qa_imp_expect", keys=", ".join(CHECKS)))
    return PromptRow(prompt, _settings_from(where, values["settings"], settings),
                     {k: parse_check(k, v, where) for k, v in expect.items()})


def _variant_from(number: int, record: object, settings: Settings | None) -> Variant:
    where = msg("err_qa_where_run_variant", name=number)
    values = _fields(where, record, Variant)
    name = values["name"]
    _expect(where, isinstance(name, str) and 0 < len(name.strip()) <= MAX_NAME_CHARS,
            msg("err_qa_imp_name", most=MAX_NAME_CHARS))
    check_text(name, where)
    return Variant(name, _settings_from(msg("err_qa_where_run_variant", name=repr(name)), values["settings"], settings))


def _settings_from(where: str, values: object, settings: Settings | None) -> dict:
    _expect(where, isinstance(values, dict) and set(values) <= set(SETTINGS),
            msg("err_qa_imp_settings", keys=", ".join(SETTINGS)))
    if settings is None:
        return values
    return {k: v if v is None else coerce_setting(k, v, settings, where) for k, v in values.items()}


def _cell_from(run: QARun, number: int, position: int, record: object, settings: Settings | None) -> Cell:
    where = _line(number)
    values = _fields(where, record, Cell, ("type", "index", "prompt"))
    _expect(where, record.get("type") == "cell" and record.get("index") == position,
            msg("err_qa_imp_cell_order", position=position))
    _expect(where, values["status"] in STATUSES, msg("err_qa_imp_status", allowed=", ".join(STATUSES)))
    _expect(where, values["mark"] in (None, *MARKS), "err_qa_imp_mark")
    _expect(where, values.get("auto") in (None, *MARKS), "err_qa_imp_auto")
    _expect(where, values["kind"] in ("chat", "image"), "err_qa_imp_cell_kind")
    _expect(where, isinstance(values["settings"], dict) and set(values["settings"]) ==
            (_CHAT_FIELDS if values["kind"] == "chat" else _IMAGE_FIELDS), "err_qa_imp_cell_settings")
    for key in ("text", "reasoning", "image_path", "error"):
        _expect(where, values[key] is None or isinstance(values[key], str) and len(values[key]) <= MAX_TEXT_CHARS,
                msg("err_qa_imp_text_or_null", field=key, most=MAX_TEXT_CHARS))
    for key in ("comment", "auto_reason"):
        value = values.get(key, "")
        _expect(where, isinstance(value, str) and len(value) <= MAX_TEXT_CHARS, msg("err_qa_imp_text", field=key))
    _expect(where, values["stats"] is None or isinstance(values["stats"], dict), "err_qa_imp_stats")
    _expect(where, values["seconds"] is None or isinstance(values["seconds"], (int, float))
            and not isinstance(values["seconds"], bool), "err_qa_imp_seconds")
    if settings is not None:
        values["settings"] = {k: v if v is None else coerce_setting(k, v, settings, where)
                              for k, v in values["settings"].items()}
    if values["image_png"] is not None:
        _expect(where, values["kind"] == "image", "err_qa_imp_image")
        check_png(values["image_png"], where, settings.sizes if settings else None)
    return Cell(**values)


def _check_layout(run: QARun) -> None:
    """Cells must be in planned order (prompt by prompt, then variant and engine), as the grid expects."""
    expected = [(p, v, k) for p in range(len(run.rows)) for v, k in grid_columns(run)]
    found = [(c.prompt_index, c.variant, c.kind) for c in run.cells]
    if found != expected:
        raise InvalidRequestError(msg("err_qa_import_layout", expected=len(expected), found=len(found)))
