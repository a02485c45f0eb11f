"""The self-contained HTML report of a QA run: summary per variant, the grid, speed, blind A/B.

No script and no remote content: images are embedded as data URIs of validated PNGs (large ones
as JPEG thumbnails), and every user-, file- or model-written string is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json

from . import ab as qa_ab
from .expect import describe
from .grid import SUMMARY_HEADERS, cell_image, compiled, fmt_stat, grid_columns, speed, variant_summary
from .references import describe as describe_references
from .runs import MARKS, STATUSES, Cell, QARun

THUMBNAIL_PX = 512  # longest side of an image in the report; larger ones are scaled down (JPEG)
_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:6px;vertical-align:top;text-align:left}pre{white-space:pre-wrap;margin:4px 0;
max-width:420px;font-size:13px}.cell{min-width:220px}.pass{background:#e8f5e9}.fail{background:#ffebee}
.badge{font-weight:bold}.meta{color:#666;font-size:12px}img{max-width:100%;display:block}.error{color:#b71c1c}
.flag{color:#b71c1c;font-weight:bold}"""


def export_html(run: QARun, thumbnail_px: int | None = THUMBNAIL_PX) -> str:
    """A self-contained HTML report (no script, images embedded as data URIs); all text escaped."""
    e = html.escape
    meta = run.meta if isinstance(run.meta, dict) else {}
    models = meta.get("models")
    models = " · ".join(f"{k}: {v}" for k, v in models.items()) if isinstance(models, dict) else str(models or "")
    variant_rows = "".join(f"<tr><td>{e(v.name)}</td><td><code>{e(_json(v.settings))}</code></td></tr>"
                           for v in run.variants)
    summary_rows = "".join("<tr>" + "".join(f"<td>{e(_show(x))}</td>" for x in row) + "</tr>"
                           for row in variant_summary(run))
    columns = grid_columns(run)
    header = "".join(f"<th>{e(v)}{' · ' + k if run.kind == 'both' else ''}</th>" for v, k in columns)
    body = []
    for p, row in enumerate(run.rows):
        first = p * len(columns)
        tds = "".join(_cell_html(i, run.cells[i], thumbnail_px) for i in range(first, first + len(columns)))
        extra = f'<div class="meta">settings {e(_json(row.settings))}</div>' if row.settings else ""
        if row.expect:
            extra += f'<div class="meta">expect: {e(describe(row.expect))}</div>'
        if row.references:
            refs = describe_references([ref.entry() for ref in row.references])
            extra += f'<div class="meta references">references: {e(refs)}</div>'
        body.append(f"<tr><td>{p + 1}</td><td><pre>{e(row.prompt)}</pre>{extra}</td>{tds}</tr>")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>QA run {e(run.id)}</title>'
            f"<style>{_CSS}</style></head><body><h1>QA run {e(run.id)}</h1>"
            f'<p class="meta">created {e(run.created)} · {e(run.kind)} · run seed {e(str(run.run_seed))} · '
            f"{e(models)} · {e(str(meta.get('device') or ''))}</p><p>{e(summary_text(run))}</p>"
            f"<h2>Variants</h2><table><tr><th>variant</th><th>settings</th></tr>{variant_rows}</table>"
            f"<h2>Summary per variant</h2><p class=\"meta\">passed / failed: the reviewer's mark, else the automatic "
            f"verdict; errors: cells that failed to run</p><table><tr>"
            f"{''.join(f'<th>{e(h)}</th>' for h in SUMMARY_HEADERS)}</tr>{summary_rows}</table>"
            f"{_ab_html(run)}"
            f'<h2>Results</h2><table class="grid"><tr><th>#</th><th>prompt</th>{header}</tr>{"".join(body)}'
            "</table></body></html>\n")


def summary_text(run: QARun) -> str:
    """One line: cell statuses, then the reviewer's marks (errors and "marked fail" never share a word)."""
    counts = {s: sum(c.status == s for c in run.cells) for s in STATUSES}
    marks = {m: sum(c.mark == m for c in run.cells) for m in MARKS}
    auto = {m: sum(c.auto == m for c in run.cells) for m in MARKS}
    return (f"{len(run.cells)} cells · {counts['done']} done · {counts['failed']} errors · "
            f"{counts['pending'] + counts['stopped'] + counts['running']} not run · "
            f"marked: {marks['pass']} pass, {marks['fail']} fail, {len(run.cells) - sum(marks.values())} unmarked · "
            f"automatic: {auto['pass']} pass, {auto['fail']} fail")


def _ab_html(run: QARun) -> str:
    if not run.ab:
        return ""
    e = html.escape
    rows = "".join(f"<tr><td>{p['prompt_index'] + 1}</td><td>{e(p['kind'])}</td><td><pre>{e(p['prompt'])}</pre></td>"
                   f"<td>{e(p['left'])}</td><td>{e(p['right'])}</td><td>{e(p['pick'] or 'unpicked')}</td>"
                   f"<td>{e(p['winner'] or '')}</td></tr>" for p in qa_ab.per_row(run))
    return (f"<h2>Blind A/B: {e(' vs '.join(run.ab['variants']))}</h2><p>{e(qa_ab.tally_line(run))}"
            f"{'' if run.ab['revealed'] else ' (not finished: names were still hidden)'}</p>"
            "<table><tr><th>#</th><th>kind</th><th>prompt</th><th>left</th><th>right</th><th>pick</th>"
            f"<th>winner</th></tr>{rows}</table>")


def _cell_html(index: int, cell: Cell, thumbnail_px: int | None) -> str:
    e = html.escape
    parts = [f'<span class="badge">{"✅ pass" if cell.mark == "pass" else "❌ fail" if cell.mark else "unmarked"}'
             f"</span> · {e(cell.status)} · cell {index + 1}"]
    if cell.auto:
        parts.append(f'<div class="auto" data-auto="{e(cell.auto)}">automatic: {e(cell.auto)}'
                     f"{' · ' + e(cell.auto_reason) if cell.auto_reason else ''}</div>")
    if cell.comment:
        parts.append(f"<div><i>{e(cell.comment)}</i></div>")
    if cell.error:
        parts.append(f'<pre class="error">{e(cell.error)}</pre>')
    if cell.image_png:
        parts.append(f'<img alt="cell {index + 1}" src="{e(_data_uri(cell, thumbnail_px))}">')
    if cell.settings.get("references"):
        parts.append(f'<div class="meta references">edited from '
                     f'{e(describe_references(cell.settings["references"]))}</div>')
    if cell.reasoning:
        parts.append(f"<details><summary>reasoning</summary><pre>{e(cell.reasoning)}</pre></details>")
    if cell.text is not None:
        parts.append(f"<pre>{e(cell.text)}</pre>")
    parts.append(f'<div class="meta">seed {e(str(cell.settings.get("seed")))}'
                 f"{' (greedy)' if cell.settings.get('greedy') else ''}{e(_stats_line(cell))}</div>")
    if compiled(cell):
        parts.append(f'<div class="flag">⚠ {compiled(cell)} graph(s) compiled while this cell ran</div>')
    parts.append(f'<details class="meta"><summary>settings</summary><code>{e(_json(cell.settings))}</code>'
                 f"<br><code>{e(_json(cell.stats))}</code></details>")
    mark_class = f" {cell.mark}" if cell.mark in MARKS else ""
    return (f'<td class="cell{mark_class}" id="cell-{index}" data-mark="{e(cell.mark or "")}" '
            f'data-status="{e(cell.status)}">{"".join(parts)}</td>')


def _stats_line(cell: Cell) -> str:
    s, sp = cell.stats or {}, speed(cell)
    if cell.kind == "chat" and s:
        return (f" · {s.get('new_tokens')} tokens · TTFT {fmt_stat(sp.get('ttft_s'), '.3f')} s · "
                f"{fmt_stat(s.get('tokens_per_s'), '.1f')} tok/s · {s.get('finish_reason')}")
    if s:
        settings = cell.settings
        return f" · {settings.get('size')} · {settings.get('steps')} steps · {fmt_stat(s.get('seconds'), '.2f')} s"
    return ""


def _show(value: object) -> str:
    return "" if value is None else str(value)


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
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
