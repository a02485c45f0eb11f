"""Views of a QA run: the prompt x variant grid, the speed table, per-variant summary and gallery.

Everything returned is plain text and numbers: the UI shows it as text, never as HTML/Markdown.
"""

from __future__ import annotations

import statistics

from PIL import Image

from .expect import verdict
from .images import decode_png
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


def results_table(run: QARun, running: bool = False) -> tuple[list[str], list[list[str]]]:
    """Headers and rows for a table: one row per prompt, one column per variant (and engine).

    ``running``: whether a set is running now; pending cells read "… pending" then, "not run" after.
    """
    both = run.kind == "both"
    headers = ["#", "prompt"] + [f"{v} · {k}" if both else v for v, k in grid_columns(run)]
    width = len(grid_columns(run))
    rows = []
    for p, row in enumerate(run.rows):
        cells = run.cells[p * width:(p + 1) * width]
        rows.append([str(p + 1), row.prompt] + [cell_summary(c, running) for c in cells])
    return headers, rows


def cell_summary(cell: Cell, running: bool = False) -> str:
    """One cell as short text: mark and verdict, output (or status/error) and its seed and stats."""
    mark = {"pass": "✅ pass", "fail": "❌ fail", None: ""}[cell.mark]
    head = " · ".join(x for x in (mark, cell.comment) if x)
    if cell.auto:
        head = " · ".join(x for x in (head, f"auto {cell.auto}" + (f": {cell.auto_reason}" if cell.auto == "fail"
                                                                     else "")) if x)
    if cell.status == RUNNING or (cell.status == PENDING and running):
        body = f"… {cell.status}"
    elif cell.status == PENDING:
        body = "— not run (Run set resumes)"
    elif cell.status == FAILED:
        body = f"⚠ failed: {cell.error}"
    elif cell.kind == "chat":
        text = (cell.text or "")[:PREVIEW_CHARS] + ("…" if len(cell.text or "") > PREVIEW_CHARS else "")
        stats = cell.stats or {}
        seed = "greedy" if cell.settings.get("greedy") else f"seed {cell.settings['seed']}"
        speed = f" · {stats.get('new_tokens')} tok · {fmt_stat(stats.get('tokens_per_s'), '.1f')} tok/s"
        speed = speed if stats else ""
        body = f"{text}\n[{seed}{speed}{compiled_flag(cell)}]"
    else:
        s = cell.settings
        body = f"🖼 {s['size']} · seed {s['seed']} · {s['steps']} steps"
        if cell.stats:
            body += f" · {fmt_stat(cell.stats.get('seconds'), '.1f')} s{compiled_flag(cell)}"
    if cell.status == STOPPED:
        body = f"⏹ stopped\n{body}"
    return f"{head}\n{body}" if head else body


def compiled_flag(cell: Cell) -> str:
    """" · ⚠ compiled N" when graphs compiled while the cell ran (none may after warm-up), else ""."""
    n = compiled(cell)
    return f" · ⚠ compiled {n}" if n else ""


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


SPEED_HEADERS = ["cell", "prompt #", "variant", "kind", "status", "verdict", "TTFT s", "tok/s", "new tokens",
                 "image s", "graphs compiled", "flag"]
SPEED_TYPES = ["number", "number", "str", "str", "str", "str", "number", "number", "number", "number", "number",
               "str"]


def speed_rows(run: QARun) -> list[list]:
    """One row per cell (numbers stay numbers, so the table sorts by them); cell numbers are 1-based."""
    rows = []
    for i, cell in enumerate(run.cells):
        sp = speed(cell)
        rows.append([i + 1, cell.prompt_index + 1, cell.variant, cell.kind, cell.status, verdict(cell) or "",
                     _round(sp.get("ttft_s")), _round(sp.get("tokens_per_s")), sp.get("new_tokens"),
                     _round(sp.get("image_s")), sp.get("compiled_graphs"),
                     "⚠ compiled" if compiled(cell) else ""])
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


SUMMARY_HEADERS = ["variant", "cells", "passed", "failed", "unmarked", "errors", "median TTFT s", "median tok/s",
                   "median new tokens", "median image s", "cells that compiled"]


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


def summary_line(run: QARun) -> str:
    """Per variant, one line: ``cold: 3 passed · 1 failed · 1 unmarked``."""
    return " | ".join(f"{row[0]}: {row[2]} passed · {row[3]} failed · {row[4]} unmarked"
                      for row in variant_summary(run))


def gallery_items(run: QARun) -> list[tuple[Image.Image, str]]:
    """(image, caption) for each image cell that has one: prompt #, variant, size, seed and mark."""
    items = []
    for i, cell in enumerate(run.cells):
        image = cell_image(cell)
        if image is not None:
            mark = f" · {verdict(cell)}" if verdict(cell) else ""
            items.append((image, f"cell {i + 1} · #{cell.prompt_index + 1} · {cell.variant} · "
                                 f"{image.size[0]}x{image.size[1]} · seed {cell.settings['seed']}{mark}"))
    return items


def cell_image(cell: Cell) -> Image.Image | None:
    """The cell's image decoded from its stored PNG, or None for chat and unfinished cells."""
    return decode_png(cell.image_png)
