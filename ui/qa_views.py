"""What the QA bench tab shows of a run: grid, gallery, summary, speed, blind A/B pair, compare view.

Only Gradio updates built from ``neuron_backend.qa``; everything from a file, a user or a model is
shown as text (Textbox, Dataframe, captions), never as HTML or Markdown, and error toasts are
escaped (Gradio renders a toast's message as HTML).
"""

from __future__ import annotations

import html

import gradio as gr

from neuron_backend.errors import ShowcaseError
from neuron_backend.qa import ab as qa_ab
from neuron_backend.qa import grid as qa_grid
from neuron_backend.qa.compare import changed_only, compare_runs, compare_table
from neuron_backend.qa.images import decode_png

VIEW_COUNT = 4  # grid, gallery, summary, speed


def refuse(exc: ShowcaseError | str):
    """Raise the error toast for a refusal, its text escaped (it may echo a variant key or a CSV header)."""
    raise gr.Error(html.escape(str(exc))) from None


def column_widths(columns: int) -> list[str]:
    """#, prompt, then the result columns sharing the rest: 2-3 variants fit side by side at 1280 px."""
    prompt = 24 if columns <= 3 else 16
    rest = (100 - 4 - prompt) / max(columns, 1)
    return ["4%", f"{prompt}%"] + [f"{rest:.1f}%"] * columns


def views(run, running: bool = False) -> tuple:
    """Updates of the grid, gallery, per-variant summary and speed table."""
    if run is None:
        return gr.update(value=None), [], gr.update(value=None), gr.update(value=None)
    headers, rows = qa_grid.results_table(run, running)
    grid = gr.update(value={"headers": headers, "data": rows}, column_widths=column_widths(len(headers) - 2))
    summary = gr.update(value={"headers": qa_grid.SUMMARY_HEADERS, "data": qa_grid.variant_summary(run)})
    speed = gr.update(value={"headers": qa_grid.SPEED_HEADERS, "data": qa_grid.speed_rows(run)})
    return grid, qa_grid.gallery_items(run), summary, speed


def variant_choices(run) -> tuple:
    """The two A/B dropdowns: every variant of the run, the first two chosen."""
    names = [v.name for v in run.variants] if run is not None else []
    first, second = (names + [None, None])[:2]
    return gr.update(choices=names, value=first), gr.update(choices=names, value=second)


AB_OUTPUTS = 6  # heading, left text, left image, right text, right image, result


def ab_view(run) -> tuple:
    """The blind pair to pick next (no name, seed or setting of either side), or the revealed result."""
    blank = gr.update(value=None, visible=False)
    if run is None or not run.ab:
        return "Choose two variants and start a blind review.", blank, blank, blank, blank, ""
    review = run.ab
    n = qa_ab.next_pair(run)
    picked = sum(p["pick"] is not None for p in review["pairs"])
    if review["revealed"] or n is None:
        return (f"Done: {picked} of {len(review['pairs'])} pairs picked. Names revealed below.",
                blank, blank, blank, blank, ab_result(run))
    pair = review["pairs"][n]
    left, right = qa_ab.pair_cells(run, n)
    heading = (f"Pair {n + 1} of {len(review['pairs'])} · {pair['kind']} · prompt #{pair['prompt_index'] + 1}: "
               f"{run.rows[pair['prompt_index']].prompt}")
    return (heading, *_side(left), *_side(right),
            f"{picked} of {len(review['pairs'])} picked; names stay hidden until every pair is picked.")


def _side(cell) -> tuple:
    if cell.kind == "image":
        image = decode_png(cell.image_png) if cell.image_png else None
        text = "" if image is not None else f"(no image: {cell.status})"
        return gr.update(value=text, visible=image is None), gr.update(value=image, visible=image is not None)
    text = cell.text if cell.status == "done" else f"({cell.status}{': ' + cell.error if cell.error else ''})"
    if cell.reasoning:
        text = f"[reasoning]\n{cell.reasoning}\n[answer]\n{text}"
    return gr.update(value=text, visible=True), gr.update(value=None, visible=False)


def ab_result(run) -> str:
    """Tally and every pair's pick with the names, as plain text."""
    lines = [f"{' vs '.join(run.ab['variants'])}: {qa_ab.tally_line(run)}"]
    for p in qa_ab.per_row(run):
        won = p["winner"] or "unpicked"
        lines.append(f"#{p['prompt_index'] + 1} {p['kind']}: left {p['left']}, right {p['right']} -> "
                     f"{p['pick'] or 'unpicked'} ({won})")
    return "\n".join(lines)


def compare_view(old, new, only_changed: bool) -> tuple:
    """The compare table (only changed cells when asked), the chat diffs as text, the image pairs."""
    if old is None or new is None:
        return gr.update(value=None), "", []
    changes = compare_runs(old, new)
    headers, rows = compare_table(changes, only_changed)
    changed = changed_only(old, new, changes)
    diffs = "\n\n".join(f"{c.caption}\n{c.diff or '(same text; see what changed)'}" for c in changed
                        if c.image is None)
    images = [(c.image, c.caption) for c in changed if c.image is not None]
    note = f"{len(changed)} of {len(changes)} cells changed"
    return gr.update(value={"headers": headers, "data": rows}, label=f"What changed ({note})"), diffs, images
