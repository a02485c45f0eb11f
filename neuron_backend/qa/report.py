"""QA bench reports: JSONL export and import (exact round trip), a self-contained HTML report, run comparison.

JSONL layout: the first line is the run (``"type": "run"``: id, created, kind, run_seed, rows,
variants, meta); then one ``"type": "cell"`` line per cell with every Cell field plus the prompt
text for convenience (ignored on import). ``import_jsonl(export_jsonl(run)) == run``.

Everything in a run is treated as hostile text: imports are checked field by field, and the HTML
report escapes every user- or model-written string and embeds images only as validated base64.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import html
import io
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..errors import InvalidRequestError
from .grid import cell_image, fmt_stat, grid_columns
from .inputs import SETTINGS, PromptRow, Variant
from .runs import KINDS, MARKS, PENDING, RUNNING, STATUSES, Cell, QARun

FORMAT, VERSION = "trainium-showcase-qa", 1
THUMBNAIL_PX = 512  # longest side of an image in the HTML report; larger ones are scaled down (JPEG)
_CHAT_FIELDS = {"system_prompt", "thinking", "greedy", "temperature", "top_p", "top_k", "max_new_tokens", "seed"}
_IMAGE_FIELDS = {"size", "steps", "seed", "guidance"}
UNFINISHED = {PENDING, RUNNING}


# ----- JSONL -----------------------------------------------------------------------------------------
def export_jsonl(run: QARun) -> str:
    """The whole run, marks and images included, one JSON object per line."""
    head = {"type": "run", "format": FORMAT, "version": VERSION, **asdict(run)}
    head.pop("cells")
    lines = [json.dumps(head, ensure_ascii=False)]
    for index, cell in enumerate(run.cells):
        record = {"type": "cell", "index": index, "prompt": run.rows[cell.prompt_index].prompt, **asdict(cell)}
        lines.append(json.dumps(record, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def read_run(path: str | Path) -> QARun:
    """Import a run from a .jsonl file written by ``export_jsonl``."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"Could not read {path.name} ({exc}); upload a .jsonl exported by the QA tab.") \
            from None
    return import_jsonl(text)


def import_jsonl(text: str) -> QARun:
    """Rebuild a run from ``export_jsonl`` output; every field is checked (InvalidRequestError says where)."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"QA run line {number} is not valid JSON ({exc.msg}).") from None
    if not records or not isinstance(records[0][1], dict) or records[0][1].get("format") != FORMAT:
        raise InvalidRequestError("This is not a QA run export: its first line must be the run record "
                                  f'with "format": "{FORMAT}".')
    head = records[0][1]
    if head.get("version") != VERSION:
        raise InvalidRequestError(f"QA run format version {head.get('version')!r} is not supported (this app "
                                  f"reads version {VERSION}).")
    run = _run_from(head)
    for position, (number, record) in enumerate(records[1:]):
        run.cells.append(_cell_from(run, number, position, record))
    _check_layout(run)
    return run


def _fields(where: str, record: object, cls, extra: tuple[str, ...] = ()) -> dict:
    names = {f.name for f in fields(cls)}
    if not isinstance(record, dict):
        raise InvalidRequestError(f"{where} must be a JSON object.")
    values = {k: v for k, v in record.items() if k not in extra}
    missing, unknown = names - set(values) - {"meta", "cells"}, set(values) - names
    if missing or unknown:
        raise InvalidRequestError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}.")
    return values


def _expect(where: str, ok: bool, what: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{where}: {what}.")


def _run_from(head: dict) -> QARun:
    values = _fields("QA run line 1", head, QARun, ("type", "format", "version"))
    _expect("QA run", values["kind"] in KINDS, "kind must be chat, image or both")
    _expect("QA run", isinstance(values["run_seed"], int), "run_seed must be a whole number")
    _expect("QA run", all(isinstance(values[k], str) for k in ("id", "created")), "id and created must be text")
    _expect("QA run", isinstance(values.get("meta", {}), dict), "meta must be an object")
    rows = [PromptRow(**_fields(f"QA run prompt {i}", r, PromptRow)) for i, r in enumerate(_list(values, "rows"))]
    variants = [Variant(**_fields(f"QA run variant {i}", v, Variant)) for i, v in enumerate(_list(values, "variants"))]
    for item in (*rows, *variants):
        _expect("QA run", isinstance(item.settings, dict) and set(item.settings) <= set(SETTINGS),
                f"settings must be an object with keys among {', '.join(SETTINGS)}")
    _expect("QA run", all(isinstance(r.prompt, str) for r in rows), "prompts must be text")
    _expect("QA run", all(isinstance(v.name, str) for v in variants), "variant names must be text")
    return QARun(values["id"], values["created"], values["kind"], values["run_seed"], rows, variants, [],
                 values.get("meta", {}))


def _list(values: dict, key: str) -> list:
    _expect("QA run", isinstance(values[key], list) and values[key], f"{key} must be a non-empty list")
    return values[key]


def _cell_from(run: QARun, number: int, position: int, record: object) -> Cell:
    where = f"QA run line {number}"
    values = _fields(where, record, Cell, ("type", "index", "prompt"))
    _expect(where, record.get("type") == "cell" and record.get("index") == position, f"expected cell {position}")
    _expect(where, values["status"] in STATUSES, f"status must be one of {', '.join(STATUSES)}")
    _expect(where, values["mark"] in (None, *MARKS), "mark must be pass, fail or null")
    _expect(where, isinstance(values["settings"], dict) and set(values["settings"]) ==
            (_CHAT_FIELDS if values["kind"] == "chat" else _IMAGE_FIELDS), "settings do not match the cell's kind")
    for key in ("text", "reasoning", "image_png", "image_path", "error"):
        _expect(where, values[key] is None or isinstance(values[key], str), f"{key} must be text or null")
    _expect(where, isinstance(values["comment"], str), "comment must be text")
    _expect(where, values["stats"] is None or isinstance(values["stats"], dict), "stats must be an object or null")
    if values["image_png"] is not None:
        try:
            base64.b64decode(values["image_png"], validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError(f"{where}: image_png is not valid base64.") from None
    return Cell(**values)


def _check_layout(run: QARun) -> None:
    """Cells must be in planned order (prompt by prompt, then variant and engine), as the grid expects."""
    expected = [(p, v, k) for p in range(len(run.rows)) for v, k in grid_columns(run)]
    found = [(c.prompt_index, c.variant, c.kind) for c in run.cells]
    if found != expected:
        raise InvalidRequestError(f"The QA run's cells do not match its prompts and variants: expected "
                                  f"{len(expected)} cells in prompt x variant order, found {len(found)}.")


# ----- HTML ------------------------------------------------------------------------------------------
_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:6px;vertical-align:top;text-align:left}pre{white-space:pre-wrap;margin:4px 0;
max-width:420px;font-size:13px}.cell{min-width:220px}.pass{background:#e8f5e9}.fail{background:#ffebee}
.badge{font-weight:bold}.meta{color:#666;font-size:12px}img{max-width:100%;display:block}.error{color:#b71c1c}"""


def export_html(run: QARun, thumbnail_px: int | None = THUMBNAIL_PX) -> str:
    """A self-contained HTML report (no script, images embedded as data URIs); all text escaped."""
    e = html.escape
    counts = {s: sum(c.status == s for c in run.cells) for s in STATUSES}
    marks = {m: sum(c.mark == m for c in run.cells) for m in MARKS}
    summary = (f"{len(run.cells)} cells · {counts['done']} done · {counts['failed']} failed · "
               f"{counts['pending'] + counts['stopped'] + counts['running']} not run · {marks['pass']} pass · "
               f"{marks['fail']} fail · {len(run.cells) - sum(marks.values())} unmarked")
    meta = run.meta or {}
    models = " · ".join(f"{k}: {v}" for k, v in (meta.get("models") or {}).items())
    variant_rows = "".join(f"<tr><td>{e(v.name)}</td><td><code>{e(_json(v.settings))}</code></td></tr>"
                           for v in run.variants)
    columns = grid_columns(run)
    header = "".join(f"<th>{e(v)}{' · ' + k if run.kind == 'both' else ''}</th>" for v, k in columns)
    body = []
    for p, row in enumerate(run.rows):
        first = p * len(columns)
        tds = "".join(_cell_html(i, run.cells[i], thumbnail_px) for i in range(first, first + len(columns)))
        extra = f'<div class="meta">{e(_json(row.settings))}</div>' if row.settings else ""
        body.append(f"<tr><td>{p + 1}</td><td><pre>{e(row.prompt)}</pre>{extra}</td>{tds}</tr>")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>QA run {e(run.id)}</title>'
            f"<style>{_CSS}</style></head><body><h1>QA run {e(run.id)}</h1>"
            f'<p class="meta">created {e(run.created)} · {e(run.kind)} · run seed {run.run_seed} · '
            f"{e(models)} · {e(str(meta.get('device', '')))}</p><p>{e(summary)}</p>"
            f"<h2>Variants</h2><table><tr><th>variant</th><th>settings</th></tr>{variant_rows}</table>"
            f'<h2>Results</h2><table class="grid"><tr><th>#</th><th>prompt</th>{header}</tr>{"".join(body)}'
            "</table></body></html>\n")


def _cell_html(index: int, cell: Cell, thumbnail_px: int | None) -> str:
    e = html.escape
    parts = [f'<span class="badge">{"✅ pass" if cell.mark == "pass" else "❌ fail" if cell.mark else "unmarked"}'
             f"</span> · {e(cell.status)}"]
    if cell.comment:
        parts.append(f"<div><i>{e(cell.comment)}</i></div>")
    if cell.error:
        parts.append(f'<pre class="error">{e(cell.error)}</pre>')
    if cell.image_png:
        parts.append(f'<img alt="cell {index}" src="{e(_data_uri(cell, thumbnail_px))}">')
    if cell.reasoning:
        parts.append(f"<details><summary>reasoning</summary><pre>{e(cell.reasoning)}</pre></details>")
    if cell.text is not None:
        parts.append(f"<pre>{e(cell.text)}</pre>")
    parts.append(f'<div class="meta">seed {e(str(cell.settings.get("seed")))}'
                 f"{' (greedy)' if cell.settings.get('greedy') else ''}{e(_stats_line(cell))}</div>")
    parts.append(f'<details class="meta"><summary>settings</summary><code>{e(_json(cell.settings))}</code>'
                 f"<br><code>{e(_json(cell.stats))}</code></details>")
    mark_class = f" {cell.mark}" if cell.mark in MARKS else ""
    return (f'<td class="cell{mark_class}" id="cell-{index}" data-mark="{e(cell.mark or "")}" '
            f'data-status="{e(cell.status)}">{"".join(parts)}</td>')


def _stats_line(cell: Cell) -> str:
    s = cell.stats or {}
    if cell.kind == "chat" and s:
        return (f" · {s.get('new_tokens')} tokens · {fmt_stat(s.get('tokens_per_s'), '.1f')} tok/s · "
                f"{s.get('finish_reason')}")
    if s:
        settings = cell.settings
        return f" · {settings.get('size')} · {settings.get('steps')} steps · {fmt_stat(s.get('seconds'), '.2f')} s"
    return ""


def _data_uri(cell: Cell, thumbnail_px: int | None) -> str:
    image = cell_image(cell)
    if thumbnail_px is None or max(image.size) <= thumbnail_px:
        return "data:image/png;base64," + cell.image_png
    image = image.convert("RGB")
    image.thumbnail((thumbnail_px, thumbnail_px))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# ----- comparing -------------------------------------------------------------------------------------
@dataclass
class CellChange:
    """How one prompt x variant x engine cell differs between an old and a new run."""

    prompt: str
    variant: str
    kind: str
    change: str  # "same" | "changed" | "not run" (either side unfinished) | "only in old" | "only in new"
    what: list[str]  # e.g. ["output", "settings: temperature", "status: done -> failed"]
    old_index: int | None
    new_index: int | None
    old_mark: str | None
    new_mark: str | None
    deltas: dict  # numeric stats, new minus old: tokens_per_s, new_tokens, seconds


def compare_runs(old: QARun, new: QARun) -> list[CellChange]:
    """Match cells by prompt text, variant name and engine; say what changed in each (new run order)."""
    old_cells, new_cells = _keyed(old), _keyed(new)
    changes = []
    for key, j in new_cells.items():
        i = old_cells.get(key)
        if i is None:
            changes.append(CellChange(key[0], key[1], key[2], "only in new", [], None, j, None, new.cells[j].mark, {}))
            continue
        a, b = old.cells[i], new.cells[j]
        what = _differences(a, b)
        change = "not run" if UNFINISHED & {a.status, b.status} else "changed" if what else "same"
        changes.append(CellChange(key[0], key[1], key[2], change, what, i, j, a.mark, b.mark, _deltas(a, b)))
    for key, i in old_cells.items():
        if key not in new_cells:
            changes.append(CellChange(key[0], key[1], key[2], "only in old", [], i, None, old.cells[i].mark, None, {}))
    return changes


def compare_table(changes: list[CellChange]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows for showing ``compare_runs`` output."""
    headers = ["prompt", "variant", "kind", "change", "what", "old mark", "new mark", "Δ"]
    rows = [[c.prompt, c.variant, c.kind, c.change, "; ".join(c.what), c.old_mark or "", c.new_mark or "",
             ", ".join(f"{k} {v:+.3g}" for k, v in c.deltas.items())] for c in changes]
    return headers, rows


def _keyed(run: QARun) -> dict[tuple[str, str, str, int], int]:
    """(prompt, variant, kind, n-th occurrence of that prompt) -> cell index."""
    seen: dict[tuple, int] = {}
    out = {}
    for index, cell in enumerate(run.cells):
        base = (run.rows[cell.prompt_index].prompt, cell.variant, cell.kind)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[(*base, n)] = index
    return out


def _differences(a: Cell, b: Cell) -> list[str]:
    """Status, output and settings differences; marks are the reviewer's, shown apart, never a change."""
    what = []
    if a.status != b.status:
        what.append(f"status: {a.status} -> {b.status}")
    if (a.text, a.reasoning) != (b.text, b.reasoning) or _pixels(a) != _pixels(b):
        what.append("output")
    keys = sorted(set(a.settings) | set(b.settings))
    return what + [f"settings: {k}" for k in keys if a.settings.get(k) != b.settings.get(k)]


def _pixels(cell: Cell) -> str | None:
    """A hash of the decoded pixels: PNGs written by another Pillow version may differ in bytes only."""
    image = cell_image(cell)
    if image is None:
        return None
    return hashlib.sha256(image.convert("RGB").tobytes() + repr(image.size).encode()).hexdigest()


def _deltas(a: Cell, b: Cell) -> dict:
    pairs = {"seconds": (a.seconds, b.seconds)}
    if a.kind == "chat":
        pairs.update({k: ((a.stats or {}).get(k), (b.stats or {}).get(k)) for k in ("tokens_per_s", "new_tokens")})
    return {k: round(vb - va, 3) for k, (va, vb) in pairs.items() if _number(va) and _number(vb)}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
