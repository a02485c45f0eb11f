"""Views of a QA run: the prompt x variant grid, the cell summaries, the gallery of image cells."""

from __future__ import annotations

import base64
import io

from PIL import Image

from .runs import FAILED, KINDS, PENDING, RUNNING, STOPPED, Cell, QARun


def grid_columns(run: QARun) -> list[tuple[str, str]]:
    """The (variant, kind) of each result column of ``results_table``, left to right."""
    return [(v.name, k) for v in run.variants for k in KINDS[run.kind]]


def grid_cell(run: QARun, row: int, column: int) -> int | None:
    """The cell index behind ``results_table`` position (row, column), or None for the #/prompt columns."""
    columns = grid_columns(run)
    if not 0 <= row < len(run.rows) or not 2 <= column < 2 + len(columns):
        return None
    return row * len(columns) + column - 2  # cells are planned prompt by prompt, in column order


def results_table(run: QARun) -> tuple[list[str], list[list[str]]]:
    """Headers and rows for a table: one row per prompt, one column per variant (and engine)."""
    both = run.kind == "both"
    headers = ["#", "prompt"] + [f"{v} · {k}" if both else v for v, k in grid_columns(run)]
    width = len(grid_columns(run))
    rows = []
    for p, row in enumerate(run.rows):
        cells = run.cells[p * width:(p + 1) * width]
        rows.append([str(p + 1), row.prompt] + [cell_summary(c) for c in cells])
    return headers, rows


def cell_summary(cell: Cell) -> str:
    """One cell as short text: mark, output (or status/error) and its seed and stats."""
    mark = {"pass": "✅ pass", "fail": "❌ fail", None: ""}[cell.mark]
    head = f"{mark} · {cell.comment}" if cell.comment else mark
    if cell.status in (PENDING, RUNNING):
        body = f"… {cell.status}"
    elif cell.status == FAILED:
        body = f"⚠ failed: {cell.error}"
    elif cell.kind == "chat":
        text = (cell.text or "")[:200] + ("…" if len(cell.text or "") > 200 else "")
        stats = cell.stats or {}
        seed = "greedy" if cell.settings.get("greedy") else f"seed {cell.settings['seed']}"
        speed = f" · {stats.get('new_tokens')} tok · {fmt_stat(stats.get('tokens_per_s'), '.1f')} tok/s"
        speed = speed if stats else ""
        body = f"{text}\n[{seed}{speed}]"
    else:
        s = cell.settings
        body = f"🖼 {s['size']} · seed {s['seed']} · {s['steps']} steps"
        if cell.stats:
            body += f" · {fmt_stat(cell.stats.get('seconds'), '.1f')} s"
    if cell.status == STOPPED:
        body = f"⏹ stopped\n{body}"
    return f"{head}\n{body}" if head else body


def fmt_stat(value: object, spec: str) -> str:
    """A stats number formatted, or the value as text (an imported file may hold anything)."""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def gallery_items(run: QARun) -> list[tuple[Image.Image, str]]:
    """(image, caption) for each image cell that has one, for a gallery next to the table."""
    items = []
    for cell in run.cells:
        image = cell_image(cell)
        if image is not None:
            mark = f" · {cell.mark}" if cell.mark else ""
            items.append((image, f"#{cell.prompt_index + 1} · {cell.variant} · seed {cell.settings['seed']}{mark}"))
    return items


def cell_image(cell: Cell) -> Image.Image | None:
    """The cell's image decoded from its stored PNG, or None for chat and unfinished cells."""
    if not cell.image_png:
        return None
    return Image.open(io.BytesIO(base64.b64decode(cell.image_png)))
