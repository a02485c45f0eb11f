"""Views of a QA run: the prompt x variant grid, the speed table, per-variant summary and gallery.

Everything returned is plain text and numbers: the UI shows it as text, never as HTML/Markdown. Words
(headers, statuses, verdicts, captions) are in ``lang``, the page's language ("en", what the CLI and the
exports read, by default); prompts, variant names and the model's output are data, shown as they are.
"""

from __future__ import annotations

import statistics

from PIL import Image

from neuron_backend.messages import tr

from .expect import judge, verdict, word
from .images import decode_png
from .references import describe as describe_references
from .runs import FAILED, KINDS, PENDING, RUNNING, STOPPED, Cell, QARun

PREVIEW_CHARS = 400  # of a chat answer in the grid; the whole text is in the exports


def grid_columns(run: QARun) -> list[tuple[str, str]]:
    """The (variant, kind) of each result column of ``results_table``, left to right."""
    return [(v.name, k) for v in run.variants for k in KINDS[run.kind]]


def grid_cell(run: QARun, row: int, column: int) -> int | None:
    """The cell index behind ``results_table`` position (row, column), or None for the #/prompt columns."""
    columns = grid_columns(run)
    if not 0 <= row < len(run.rows) or not 2 <= column < 2 + len(columns):
        return None
    return row * len(columns) + column - 2  # cells are planned prompt by prompt, in column order


def _in(lang: str, key: str, **params) -> str:
    return tr(key, **params).text(lang)


def _word(lang: str, family: str, value) -> str:
    """A status, kind or verdict word in ``lang`` (anything unknown, e.g. from an imported file, as it is)."""
    found = word(family, value)
    return found.text(lang) if hasattr(found, "text") else str(found)


def results_table(run: QARun, running: bool = False, lang: str = "en") -> tuple[list[str], list[list[str]]]:
    """Headers and rows for a table: one row per prompt, one column per variant (and engine).

    ``running``: whether a set is running now; pending cells read "… pending" then, "not run" after.
    """
    both = run.kind == "both"
    columns = [_in(lang, "{variant} · {kind}", variant=v, kind=_word(lang, "kind", k)) if both else v
               for v, k in grid_columns(run)]
    headers = ["#", _in(lang, "prompt"), *columns]
    width = len(grid_columns(run))
    rows = []
    for p, row in enumerate(run.rows):
        cells = run.cells[p * width:(p + 1) * width]
        rows.append([str(p + 1), row.prompt] + [cell_summary(c, running, lang, _reason(row.expect, c, lang))
                                                for c in cells])
    return headers, rows


def _reason(expect: dict, cell: Cell, lang: str) -> str:
    """Why the automatic verdict failed, in ``lang``: judged again (the run stores the English reason)."""
    if lang == "en" or cell.auto != "fail":
        return cell.auto_reason
    again, reason = judge(expect, cell, lang)
    return reason if again == cell.auto else cell.auto_reason


def cell_summary(cell: Cell, running: bool = False, lang: str = "en", reason: str | None = None) -> str:
    """One cell as short text: mark and verdict, output (or status/error) and its seed and stats.

    ``reason``: why the automatic verdict failed, in ``lang`` (default: the stored English one).
    """
    icon = {"pass": "✅", "fail": "❌"}.get(cell.mark)
    mark = _in(lang, "{icon} {verdict}", icon=icon, verdict=_word(lang, "", cell.mark)) if icon else ""
    head = " · ".join(x for x in (mark, cell.comment) if x)
    if cell.auto:
        auto = _word(lang, "", cell.auto)
        why = (_in(lang, "auto {verdict}: {reason}",
                   verdict=auto, reason=cell.auto_reason if reason is None else reason)
               if cell.auto == "fail" else _in(lang, "auto {verdict}", verdict=auto))
        head = " · ".join(x for x in (head, why) if x)
    if cell.status == RUNNING or (cell.status == PENDING and running):
        body = f"… {_word(lang, 'status', cell.status)}"
    elif cell.status == PENDING:
        body = _in(lang, "— not run (Run set resumes)")
    elif cell.status == FAILED:
        body = _in(lang, "⚠ failed: {error}", error=cell.error)
    elif cell.kind == "chat":
        text = (cell.text or "")[:PREVIEW_CHARS] + ("…" if len(cell.text or "") > PREVIEW_CHARS else "")
        stats = cell.stats or {}
        seed = _in(lang, "greedy") if cell.settings.get("greedy") else _in(lang, "seed {seed}",
                                                                                  seed=cell.settings["seed"])
        speed = _in(lang, " · {tokens} tok · {rate} tok/s", tokens=stats.get("new_tokens"),
                    rate=fmt_stat(stats.get("tokens_per_s"), ".1f")) if stats else ""
        body = f"{text}\n[{seed}{speed}{compiled_flag(cell, lang)}]"
    else:
        s = cell.settings
        body = _in(lang, "🖼 {size} · seed {seed} · {steps} steps", size=s["size"], seed=s["seed"], steps=s["steps"])
        if s.get("references"):
            body += "\n" + _in(lang, "edited from {references}", references=describe_references(s["references"]))
        if cell.stats:
            body += _in(lang, " · {seconds} s", seconds=fmt_stat(cell.stats.get("seconds"), ".1f"))
            body += compiled_flag(cell, lang)
    if cell.status == STOPPED:
        body = f"⏹ {_word(lang, 'status', STOPPED)}\n{body}"
    return f"{head}\n{body}" if head else body


def compiled_flag(cell: Cell, lang: str = "en") -> str:
    """" · ⚠ compiled N" when graphs compiled while the cell ran (none may after warm-up), else ""."""
    n = compiled(cell)
    return _in(lang, " · ⚠ compiled {count}", count=n) if n else ""


def compiled(cell: Cell) -> int:
    value = (cell.stats or {}).get("compiled_graphs")
    return value if _number(value) and value > 0 else 0


def fmt_stat(value: object, spec: str) -> str:
    """A stats number formatted, or the value as text (an imported file may hold anything)."""
    return format(value, spec) if _number(value) else str(value)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def speed(cell: Cell) -> dict:
    """The cell's speed and cost: ttft_s, tokens_per_s, new_tokens (chat), image_s (image), compiled_graphs."""
    s = cell.stats or {}
    pick = {"ttft_s": s.get("time_to_first_token_s"), "tokens_per_s": s.get("tokens_per_s"),
            "new_tokens": s.get("new_tokens")} if cell.kind == "chat" else {"image_s": s.get("seconds")}
    out = {k: v if _number(v) else None for k, v in pick.items()}
    out["compiled_graphs"] = s.get("compiled_graphs") if _number(s.get("compiled_graphs")) else None
    return out


_SPEED = ("cell", "prompt", "variant", "kind", "status", "verdict", "ttft", "rate", "tokens", "image", "graphs", "flag")
# English (str); speed_headers(lang) for the page
SPEED_HEADERS = [tr("cell"), tr("prompt #"), tr("variant"), tr("kind"), tr("status"), tr("verdict"), tr("TTFT s"),
                 tr("tok/s"), tr("new tokens"), tr("image s"), tr("graphs compiled"), tr("flag")]
SPEED_TYPES = ["number", "number", "str", "str", "str", "str", "number", "number", "number", "number", "number",
               "str"]


def speed_headers(lang: str = "en") -> list[str]:
    return [h.text(lang) for h in SPEED_HEADERS]


def speed_rows(run: QARun, lang: str = "en") -> list[list]:
    """One row per cell (numbers stay numbers, so the table sorts by them); cell numbers are 1-based."""
    rows = []
    for i, cell in enumerate(run.cells):
        sp = speed(cell)
        rows.append([i + 1, cell.prompt_index + 1, cell.variant, _word(lang, "kind", cell.kind),
                     _word(lang, "status", cell.status), _word(lang, "", verdict(cell)) if verdict(cell) else "",
                     _round(sp.get("ttft_s")), _round(sp.get("tokens_per_s")), sp.get("new_tokens"),
                     _round(sp.get("image_s")), sp.get("compiled_graphs"),
                     _in(lang, "⚠ compiled") if compiled(cell) else ""])
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


SUMMARY_HEADERS = [tr("variant"), tr("cells"), tr("passed"), tr("failed", ctx="qa"), tr("unmarked"), tr("errors"),
                   tr("median TTFT s"), tr("median tok/s"), tr("median new tokens"), tr("median image s"),
                   tr("cells that compiled")]


def summary_headers(lang: str = "en") -> list[str]:
    """SUMMARY_HEADERS (English, what the HTML report shows) in ``lang``."""
    return [h.text(lang) for h in SUMMARY_HEADERS]


def variant_summary(run: QARun) -> list[list]:
    """Per variant: verdict counts (mark, else automatic) and the medians of the speed columns."""
    out = []
    for variant in run.variants:
        cells = [c for c in run.cells if c.variant == variant.name]
        verdicts = [verdict(c) for c in cells]
        speeds = [speed(c) for c in cells if c.stats]
        out.append([variant.name, len(cells), verdicts.count("pass"), verdicts.count("fail"), verdicts.count(None),
                    sum(c.status == FAILED for c in cells),
                    *(_median([s.get(k) for s in speeds]) for k in ("ttft_s", "tokens_per_s", "new_tokens", "image_s")),
                    sum(bool(compiled(c)) for c in cells)])
    return out


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def summary_line(run: QARun, lang: str = "en") -> str:
    """Per variant, one line: ``cold: 3 passed · 1 failed · 1 unmarked``."""
    return " | ".join(_in(lang, "{name}: {passed} passed · {failed} failed · {unmarked} unmarked",
                          name=row[0], passed=row[2], failed=row[3], unmarked=row[4])
                      for row in variant_summary(run))


def gallery_items(run: QARun, lang: str = "en") -> list[tuple[Image.Image, str]]:
    """(image, caption) for each image cell that has one: prompt #, variant, size, seed and mark."""
    items = []
    for i, cell in enumerate(run.cells):
        image = cell_image(cell)
        if image is not None:
            mark = f" · {_word(lang, '', verdict(cell))}" if verdict(cell) else ""
            items.append((image, _in(lang, "cell {number} · #{prompt} · {variant} · {size} · seed {seed}{verdict}",
                                     number=i + 1, prompt=cell.prompt_index + 1,
                                     variant=cell.variant, size=f"{image.size[0]}x{image.size[1]}",
                                     seed=cell.settings["seed"], verdict=mark)))
    return items


def cell_image(cell: Cell) -> Image.Image | None:
    """The cell's image decoded from its stored PNG, or None for chat and unfinished cells."""
    return decode_png(cell.image_png)
