"""CSV export of a QA run: one row per cell with every setting, verdicts, marks, speed and A/B pick.

An edit's ``references`` column names each reference image: ``refs/cat.png 1a2b3c4d5e6f letterbox; ...``
(its path as the prompt set wrote it, the first 12 hex digits of its sha256, its fit mode).

Spreadsheets run a cell that starts with ``=``, ``+``, ``-`` or ``@`` (and some read tab or
carriage return the same way) as a formula, so any text cell starting with one of them is written
with a leading apostrophe (OWASP's advice for CSV injection). Numbers the bench measured itself
(e.g. a negative delta) are written as numbers.
"""

from __future__ import annotations

import csv
import io
import json

from . import ab as qa_ab
from .expect import describe, verdict
from .grid import speed
from .inputs import SETTINGS
from .references import describe as describe_references
from .runs import QARun

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
COLUMNS = ["cell", "prompt_number", "prompt", "variant", "kind", "status", *SETTINGS, "references", "expect", "auto",
           "auto_reason", "mark", "comment", "verdict", "ab_pick", "ttft_s", "tokens_per_s", "new_tokens", "image_s",
           "compiled_graphs", "seconds", "finish_reason", "text", "reasoning", "error", "image_path"]


def escape_cell(value: object) -> object:
    """A value safe for a spreadsheet: text that starts like a formula gets a leading apostrophe."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def export_csv(run: QARun) -> str:
    """The run as CSV text (header first); cell numbers are 1-based, as in the UI."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for index, cell in enumerate(run.cells):
        row = run.rows[cell.prompt_index]
        values = {"cell": index + 1, "prompt_number": cell.prompt_index + 1, "prompt": row.prompt,
                  "variant": cell.variant, "kind": cell.kind, "status": cell.status,
                  **{k: cell.settings.get(k) for k in SETTINGS},
                  "references": describe_references(cell.settings.get("references")),
                  "expect": describe(row.expect), "auto": cell.auto, "auto_reason": cell.auto_reason,
                  "mark": cell.mark, "comment": cell.comment, "verdict": verdict(cell),
                  "ab_pick": qa_ab.cell_pick(run, cell), **speed(cell), "seconds": cell.seconds,
                  "finish_reason": (cell.stats or {}).get("finish_reason"), "text": cell.text,
                  "reasoning": cell.reasoning, "error": cell.error, "image_path": cell.image_path}
        writer.writerow([escape_cell(values.get(column)) for column in COLUMNS])
    return buffer.getvalue()
