"""What the QA bench tab shows of a run: grid, gallery, summary, speed, blind A/B pair, compare view.

Only Gradio updates built from ``tools.qa``; everything from a file, a user or a model is
shown as text (Textbox, Dataframe, captions), never as HTML or Markdown, and refusal toasts are
escaped (Gradio renders a toast's message as HTML; ``ui.api.shown`` escapes it). Words are in the
page's language (``ui.i18n``): headers, statuses, verdicts and captions; prompts, variant names and
the model's output are data.
"""

from __future__ import annotations

import gradio as gr

from neuron_backend.errors import ShowcaseError
from tools.qa import ab as qa_ab
from tools.qa import grid as qa_grid
from tools.qa.compare import changed_only, compare_runs, compare_table
from tools.qa.expect import word
from tools.qa.images import decode_png
from ui.i18n import lang, localized, say

VIEW_COUNT = 4  # grid, gallery, summary, speed


def refuse(exc: ShowcaseError | str):
    """Raise a refusal as a ShowcaseError in the page's language; the tab's handlers (``refusals_as_toast``)
    show it as an escaped warning toast (it may echo a variant key) and leave their outputs as they were."""
    raise ShowcaseError(localized(exc)) from None


def shown_word(family: str, value) -> str:
    """A status, kind or verdict word ("done", "chat", "pass") in the page's language."""
    return localized(word(family, value))


def column_widths(columns: int) -> list[str]:
    """#, prompt, then the result columns sharing the rest: 2-3 variants fit side by side at 1280 px."""
    prompt = 24 if columns <= 3 else 16
    rest = (100 - 4 - prompt) / max(columns, 1)
    return ["4%", f"{prompt}%"] + [f"{rest:.1f}%"] * columns


def views(run, running: bool = False) -> tuple:
    """Updates of the grid, gallery, per-variant summary and speed table."""
    if run is None:
        return gr.update(value=None), gr.update(value=[], visible=False), gr.update(value=None), gr.update(value=None)
    language = lang()
    headers, rows = qa_grid.results_table(run, running, language)
    grid = gr.update(value={"headers": headers, "data": rows}, column_widths=column_widths(len(headers) - 2))
    summary = gr.update(value={"headers": qa_grid.summary_headers(language), "data": qa_grid.variant_summary(run)})
    speed = gr.update(value={"headers": qa_grid.speed_headers(language), "data": qa_grid.speed_rows(run, language)})
    images = qa_grid.gallery_items(run, language)  # shown once the run has an image (never for a chat-only set)
    return grid, gr.update(value=images, visible=bool(images)), summary, speed


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
        return say("Choose two variants and start a blind review."), blank, blank, blank, blank, ""
    review = run.ab
    n = qa_ab.next_pair(run)
    picked = sum(p["pick"] is not None for p in review["pairs"])
    total = len(review["pairs"])
    if review["revealed"] or n is None:
        return say("Done: {picked} of {total} pairs picked. Names revealed below.",
                   picked=picked, total=total), blank, blank, blank, blank, ab_result(run)
    pair = review["pairs"][n]
    left, right = qa_ab.pair_cells(run, n)
    heading = say("Pair {number} of {total} · {kind} · prompt #{prompt}: {text}",
                  number=n + 1, total=total, kind=shown_word("kind", pair["kind"]),
                  prompt=pair["prompt_index"] + 1, text=run.rows[pair["prompt_index"]].prompt)
    return (heading, *_side(left), *_side(right), say("{picked} of {total} picked; names stay hidden until every pair "
                                                      "is picked.", picked=picked, total=total))


def _side(cell) -> tuple:
    status = shown_word("status", cell.status)
    if cell.kind == "image":
        image = decode_png(cell.image_png) if cell.image_png else None
        text = "" if image is not None else say("(no image: {status})", status=status)
        return gr.update(value=text, visible=image is None), gr.update(value=image, visible=image is not None)
    text = cell.text if cell.status == "done" else f"({status}{': ' + localized(cell.error) if cell.error else ''})"
    if cell.reasoning:
        text = say("[reasoning]\n{reasoning}\n[answer]\n{answer}", reasoning=cell.reasoning, answer=text)
    return gr.update(value=text, visible=True), gr.update(value=None, visible=False)


def ab_result(run) -> str:
    """Tally and every pair's pick with the names, as plain text."""
    first, second = run.ab["variants"]
    lines = [say("{first} vs {second}: {tally}", first=first, second=second, tally=qa_ab.tally_line(run, lang()))]
    for p in qa_ab.per_row(run):
        pick = say(p["pick"]) if p["pick"] else say("unpicked")
        won = (say("tie") if p["winner"] == "tie" else p["winner"]) or say("unpicked")
        lines.append(say("#{prompt} {kind}: left {left}, right {right} -> {pick} ({won})",
                         prompt=p["prompt_index"] + 1, kind=shown_word("kind", p["kind"]),
                         left=p["left"], right=p["right"], pick=pick, won=won))
    return "\n".join(lines)


def compare_view(old, new, only_changed: bool) -> tuple:
    """The compare table (only changed cells when asked), the chat diffs as text, the image pairs (each of the
    two shown only when there is one)."""
    if old is None or new is None:
        return gr.update(value=None), gr.update(value="", visible=False), gr.update(value=[], visible=False)
    language = lang()
    changes = compare_runs(old, new)
    headers, rows = compare_table(changes, only_changed, language)
    changed = changed_only(old, new, changes, language)
    same = say("(same text; see what changed)")
    diffs = "\n\n".join(f"{c.caption}\n{c.diff or same}" for c in changed if c.image is None)
    images = [(c.image, c.caption) for c in changed if c.image is not None]
    label = say("What changed ({changed} of {total} cells changed)", changed=len(changed), total=len(changes))
    return (gr.update(value={"headers": headers, "data": rows}, label=label),
            gr.update(value=diffs, visible=bool(diffs)), gr.update(value=images, visible=bool(images)))
