"""The QA bench tab: run a prompt set under a few settings variants, mark cells, export, compare.

Only UI wiring; the work is in ``tools.qa`` (runs, expect, ab, compare, exports) and what
is shown is built in ``tools.qa.views``. Cell numbers are 1-based everywhere on the page. Every handler
that can refuse (a ``ShowcaseError``) shows the refusal as a warning toast and leaves all its outputs as
they were (``refusals_as_toast``): a mistake never wipes a run's results.
"""

from __future__ import annotations

import dataclasses
import threading

import gradio as gr
from gradio.context import Context

from neuron_backend.runtime import Backend
from tools.qa import ab as qa_ab
from tools.qa import grid as qa_grid
from tools.qa import report as qa_report
from tools.qa import runs as qa
from tools.qa.export_csv import export_csv
from tools.qa.html_report import export_html
from tools.qa.references import IMAGE_SUFFIXES, split_upload
from ui.api import refusals_as_toast
from ui.i18n import lang, say, t

from . import views as v

VARIANTS_HINT = "cold: temperature=0.2, seed=1\nhot: temperature=1.2, seed=1"
FORM_RESET = (0, "unmarked", "")  # cell #, mark, comment: cleared by every new run


def _file_path(upload) -> str | None:
    if upload is None:
        return None
    return upload if isinstance(upload, str) else getattr(upload, "name", None)


def planned_run(settings, text, upload_value, kind, variants, seed) -> qa.QARun:
    """The run of what the form holds: pasted prompts, or an uploaded set with its reference images.

    Gradio keeps each uploaded file in its own temporary folder: the set's rows find their references among
    the uploaded images by file name, and each cell reads its file again from Gradio's upload cache.
    """
    uploaded = [_file_path(u) for u in (upload_value if isinstance(upload_value, list) else [upload_value])]
    set_file, images = split_upload([p for p in uploaded if p])
    return qa.plan_run(settings, prompts_text=text or None, prompts_file=set_file, variants=variants or None,
                       kind=kind, run_seed=int(seed or 0), uploads=images)


def _done_line(run) -> str:
    done = sum(c.status == "done" for c in run.cells)
    return say("{done}/{total} cells done · {summary}",
               done=done, total=len(run.cells), summary=qa_grid.summary_line(run, lang()))


def _eta(p) -> str:
    return say(" · ~{seconds} s left", seconds=f"{p.eta_s:.0f}") if p.eta_s is not None else ""


def build_qa_tab(backend: Backend) -> None:
    """Components and events of the QA bench tab (call inside a gr.Tab)."""
    settings = backend.settings
    stops: dict[str, threading.Event] = {}  # session -> stop event of its running set
    kinds = [k for k in ("chat", "image") if k in backend.placements] + (["both"] if len(backend.placements) == 2
                                                                          else [])
    run_state = gr.State(None)
    compared_state = gr.State(None)  # the run the current one was compared with
    with gr.Row():
        with gr.Column():
            prompts = gr.Textbox(label=t("Prompts (one per line)"), lines=5, elem_id="qa-prompts")
            # A short label (a long one was cut off in the box's label line); what the file holds, under it.
            upload = gr.File(label=t("…or a prompt set file and its images"), file_count="multiple",
                             file_types=[".jsonl", ".csv", ".txt", *IMAGE_SUFFIXES], elem_id="qa-upload")
            gr.Markdown(t("A `.jsonl`, `.csv` or `.txt` file with a `prompt` column (and expectations), with the "
                          "reference images its rows name."), elem_id="qa-upload-hint")
        with gr.Column():
            kind = gr.Radio([(t(k, ctx="qa"), k) for k in kinds], value=kinds[0], label=t("Engine"),
                            elem_id="qa-kind")
            variants = gr.Textbox(label=t("Variants (name: key=value, …; one per line, or JSON)"), lines=4,
                                  placeholder=VARIANTS_HINT, elem_id="qa-variants")
            run_seed = gr.Number(label=t("Run seed (fixes every cell's seed)"), value=0, precision=0)
            with gr.Row():
                run_btn = gr.Button(t("Run set"), variant="primary", elem_id="qa-run")
                stop_btn = gr.Button(t("Stop"), variant="stop", elem_id="qa-stop", visible=False)  # while a set runs
    status = gr.Textbox(label=t("Status"), interactive=False, elem_id="qa-status")
    summary = gr.Dataframe(label=t("Summary per variant (passed / failed: the reviewer's mark, else the automatic "
                                   "verdict)"), interactive=False, wrap=True, elem_id="qa-summary")
    grid = gr.Dataframe(label=t("Results (prompt × variant): click a cell to review it"), interactive=False, wrap=True,
                        line_breaks=True, max_height=900, elem_id="qa-grid")
    # Each section below shows once it has something to show (views(), compare_view(), the exports).
    gallery = gr.Gallery(label=t("Images"), columns=4, height="auto", object_fit="contain", elem_id="qa-gallery",
                         visible=False)
    with gr.Row():
        cell_index = gr.Number(label=t("Cell # (click the grid; 0 = none)"), precision=0, value=0, elem_id="qa-cell")
        mark = gr.Radio([(t(m), m) for m in ("pass", "fail", "unmarked")], label=t("Mark"),
                        value="unmarked", elem_id="qa-mark")
        comment = gr.Textbox(label=t("Comment"), elem_id="qa-comment")
        save_mark_btn = gr.Button(t("Save mark"), elem_id="qa-save-mark")
        rerun_btn = gr.Button(t("Re-run cell"), elem_id="qa-rerun")
    with gr.Accordion(t("Speed and cost per cell (sort from a column's ⋮ menu)"), open=False,
                      elem_id="qa-speed-box") as speed_box:
        # Gradio's frontend does not translate a Dataframe's headers given at build time: opening the box before
        # any run writes them in the page's language; a run sends them with its rows (views()).
        speed = gr.Dataframe(headers=qa_grid.SPEED_HEADERS, datatype=qa_grid.SPEED_TYPES, interactive=False,
                             elem_id="qa-speed")

    def open_speed_box(run):
        if run is not None:
            return gr.skip()
        return gr.update(value={"headers": qa_grid.speed_headers(lang()), "data": []})

    speed_box.expand(open_speed_box, run_state, speed, queue=False, api_visibility="private")

    # An empty Dataframe shows Gradio's own column numbers ("1 2 3"): before any run, the summary and the grid
    # get their headers in the page's language when the page loads.
    def empty_tables(run):
        if run is not None:
            return gr.skip(), gr.skip()
        language = lang()
        return ({"headers": qa_grid.summary_headers(language), "data": []},
                {"headers": ["#", say("prompt")], "data": []})

    Context.root_block.load(empty_tables, run_state, [summary, grid], queue=False, api_visibility="private")
    with gr.Accordion(t("Blind A/B: two variants, names hidden, sides shuffled"), open=False, elem_id="qa-ab-box"):
        with gr.Row():
            ab_first = gr.Dropdown(label=t("Variant"), elem_id="qa-ab-first")
            ab_second = gr.Dropdown(label=t("against"), elem_id="qa-ab-second")
            ab_start_btn = gr.Button(t("Start blind review"), elem_id="qa-ab-start")
        ab_heading = gr.Textbox(label=t("Pair"), interactive=False, elem_id="qa-ab-heading")
        with gr.Row():
            with gr.Column():
                left_text = gr.Textbox(label=t("Left"), interactive=False, lines=6, elem_id="qa-ab-left")
                left_image = gr.Image(label=t("Left"), visible=False, interactive=False, elem_id="qa-ab-left-image")
            with gr.Column():
                right_text = gr.Textbox(label=t("Right"), interactive=False, lines=6, elem_id="qa-ab-right")
                right_image = gr.Image(label=t("Right"), visible=False, interactive=False,
                                       elem_id="qa-ab-right-image")
        with gr.Row():
            pick_left = gr.Button(t("Left is better"), elem_id="qa-ab-pick-left")
            pick_tie = gr.Button(t("Tie"), elem_id="qa-ab-pick-tie")
            pick_right = gr.Button(t("Right is better"), elem_id="qa-ab-pick-right")
            ab_end_btn = gr.Button(t("End and reveal"), elem_id="qa-ab-reveal")
        ab_result = gr.Textbox(label=t("Result"), interactive=False, lines=4, elem_id="qa-ab-result")
    with gr.Row():
        export_html_btn = gr.Button(t("Export HTML report"), elem_id="qa-export-html")
        export_jsonl_btn = gr.Button(t("Export JSONL"), elem_id="qa-export-jsonl")
        export_csv_btn = gr.Button(t("Export CSV"), elem_id="qa-export-csv")
        import_file = gr.File(label=t("Import a JSONL run"), file_types=[".jsonl"], height=120, elem_id="qa-import")
        compare_btn = gr.Button(t("Run it again and compare"), elem_id="qa-compare")
    export_file = gr.File(label=t("Export"), height=90, elem_id="qa-export-file", visible=False)
    with gr.Column(visible=False, elem_id="qa-compare-box") as compare_box:  # shown by the first compare
        only_changed = gr.Checkbox(label=t("Show only what changed"), value=False, elem_id="qa-only-changed")
        compare_grid = gr.Dataframe(label=t("What changed (after 'Run it again and compare')"), interactive=False,
                                    wrap=True, headers=["#", "Δ"], elem_id="qa-compare-grid")
        diff_box = gr.Textbox(label=t("Text diffs of the changed chat cells (- old, + new)"), lines=8,
                              interactive=False, elem_id="qa-diff", visible=False)
        diff_gallery = gr.Gallery(label=t("Changed images: old left, new right"), columns=2, height="auto",
                                  object_fit="contain", elem_id="qa-diff-gallery", visible=False)

    ab_views = [ab_heading, left_text, left_image, right_text, right_image, ab_result]
    views = [grid, gallery, summary, speed]
    run_outputs = [run_state, grid, gallery, summary, speed, status, cell_index, mark, comment, ab_first, ab_second,
                   *ab_views]
    mark_outputs = [run_state, *views, status]
    import_outputs = [run_state, compared_state, *run_outputs[1:]]
    compare_outputs = [*run_outputs, compared_state, compare_grid, diff_box, diff_gallery, compare_box]
    ab_outputs = [run_state, *ab_views]
    skip_tail = (gr.skip(),) * (3 + 2 + v.AB_OUTPUTS)

    @refusals_as_toast(outputs=len(run_outputs))
    def press_run(text, upload_value, kind_value, variants_text, seed, request: gr.Request,
                  progress=gr.Progress()):
        # An image cell without steps gets the model's own default, as on the Image tab (50 for a base checkpoint).
        planning = dataclasses.replace(settings, default_steps=backend.image_default_steps())
        run = planned_run(planning, text, upload_value, kind_value, variants_text, seed)
        yield from _execute(run, request, progress)

    def _execute(run, request, progress):
        session = getattr(request, "session_hash", None) or "anonymous"
        stop = stops[session] = threading.Event()

        def report(p) -> None:
            progress((p.done, p.total), desc=say("{done}/{total} cells{eta}", done=p.done, total=p.total, eta=_eta(p)),
                     unit=say("cells", ctx="qa progress"))

        try:
            for p in qa.run_cells(backend, run, stop):
                report(p)
                line = say("{done}/{total} cells done{eta}", done=p.done, total=p.total, eta=_eta(p))
                yield run, *v.views(run, running=True), line, *skip_tail
                # Gradio hides an event's progress bar at each output until its next progress message:
                # report again, or the bar stays hidden until the next cell ends.
                report(p)
        finally:
            stops.pop(session, None)
        line = say("Stopped: {line}" if stop.is_set() else "Finished: {line}", line=_done_line(run))
        yield run, *v.views(run), line, *FORM_RESET, *v.variant_choices(run), *v.ab_view(run)

    def press_stop(request: gr.Request):
        event = stops.get(getattr(request, "session_hash", None) or "anonymous")
        if event is not None:
            event.set()

    def select_cell(run, evt: gr.SelectData):
        if run is None or evt.index is None:
            return gr.skip(), gr.skip(), gr.skip()
        row, column = evt.index
        index = qa_grid.grid_cell(run, row, column)
        if index is None:
            return FORM_RESET
        cell = run.cells[index]
        return index + 1, cell.mark or "unmarked", cell.comment or ""

    def _picked(run, number) -> int:
        if run is None or not number or number < 1:
            v.refuse(say("Run a set (or import one) and pick a cell first."))
        if number > len(run.cells):
            v.refuse(say("Cell {number} does not exist; this run has cells 1 to {last}.",
                         number=int(number), last=len(run.cells)))
        return int(number) - 1

    @refusals_as_toast(outputs=len(mark_outputs))
    def press_save_mark(run, number, mark_value, comment_value):
        qa.set_mark(run, _picked(run, number), None if mark_value in (None, "", "unmarked") else mark_value,
                    comment_value)
        return run, *v.views(run), _done_line(run)

    @refusals_as_toast(outputs=len(mark_outputs))
    def press_rerun(run, number):
        index = _picked(run, number)
        cell = qa.rerun_cell(backend, run, index)
        return run, *v.views(run), say("Re-ran cell {number}: {status} · {line}",
                                       number=index + 1, status=v.shown_word("status", cell.status),
                                       line=_done_line(run))

    def press_export(text_of, suffix: str):
        @refusals_as_toast(outputs=1)
        def handler(run) -> str:
            if run is None:
                v.refuse(say("Nothing to export yet: run a set first."))
            return gr.update(value=str(backend.exports.write(text_of(run), suffix, "qa-run")), visible=True)

        return handler

    @refusals_as_toast(outputs=len(import_outputs))
    def pick_import(upload_value):
        if upload_value is None:
            return (gr.skip(),) * len(import_outputs)
        run = qa_report.read_run(_file_path(upload_value), settings)
        return (run, None, *v.views(run), say("Imported a run of {count} cells · {line}",
                                              count=len(run.cells), line=_done_line(run)),
                *FORM_RESET, *v.variant_choices(run), *v.ab_view(run))

    @refusals_as_toast(outputs=len(compare_outputs))
    def press_compare(current, only, request: gr.Request, progress=gr.Progress()):
        if current is None:
            v.refuse(say("Run a set or import a JSONL run first: the new run repeats its prompts, variants and seeds."))
        fresh = qa.new_run_like(current)
        final = None
        for final in _execute(fresh, request, progress):
            yield *final, current, gr.skip(), gr.skip(), gr.skip(), gr.skip()
        yield *final, current, *v.compare_view(current, fresh, only), gr.update(visible=True)

    @refusals_as_toast(outputs=len(ab_outputs))
    def press_ab_start(run, first, second):
        if run is None:
            v.refuse(say("Run a set (or import one) first."))
        qa_ab.start(run, first, second)
        return run, *v.ab_view(run)

    def press_pick(choice):
        @refusals_as_toast(outputs=len(ab_outputs))
        def handler(run):
            if run is None or not run.ab:
                v.refuse(say("Start a blind review first: choose two variants."))
            n = qa_ab.next_pair(run)
            if n is None:
                v.refuse(say("Every pair is picked; start a new review to pick again."))
            qa_ab.pick(run, n, choice)
            return run, *v.ab_view(run)

        return handler

    @refusals_as_toast(outputs=len(ab_outputs))
    def press_reveal(run):
        if run is None or not run.ab:
            v.refuse(say("Start a blind review first: choose two variants."))
        qa_ab.reveal(run)
        return run, *v.ab_view(run)

    private = {"api_visibility": "private"}
    # Its own queue slot: cells interleave with other tabs' requests at the engine (see qa/runs.py).
    # One progress bar, over the status line: Gradio otherwise draws it over each of the run's outputs.
    # Stop shows while a set runs (a compare runs one too): registered before the run, so it shows first;
    # .then hides it after the run ends, is stopped or refused.
    for button in (run_btn, compare_btn):
        button.click(lambda: gr.update(visible=True), None, stop_btn, queue=False, **private)
    running = run_btn.click(press_run, [prompts, upload, kind, variants, run_seed], run_outputs, concurrency_limit=2,
                            concurrency_id="qa", show_progress_on=[status], **private)
    stop_btn.click(press_stop, None, None, queue=False, **private)
    grid.select(select_cell, run_state, [cell_index, mark, comment], **private)
    save_mark_btn.click(press_save_mark, [run_state, cell_index, mark, comment], mark_outputs, **private)
    rerun_btn.click(press_rerun, [run_state, cell_index], mark_outputs, concurrency_id="qa", **private)
    export_html_btn.click(press_export(export_html, ".html"), run_state, export_file, **private)
    export_jsonl_btn.click(press_export(qa_report.export_jsonl, ".jsonl"), run_state, export_file, **private)
    export_csv_btn.click(press_export(export_csv, ".csv"), run_state, export_file, **private)
    import_file.upload(pick_import, import_file, import_outputs, **private)
    comparing = compare_btn.click(press_compare, [run_state, only_changed], compare_outputs, concurrency_id="qa",
                                  show_progress_on=[status], **private)
    for event in (running, comparing):
        event.then(lambda: gr.update(visible=False), None, stop_btn, queue=False, **private)
    only_changed.change(v.compare_view, [compared_state, run_state, only_changed],
                        [compare_grid, diff_box, diff_gallery], **private)
    ab_start_btn.click(press_ab_start, [run_state, ab_first, ab_second], ab_outputs, **private)
    for button, choice in ((pick_left, "left"), (pick_right, "right"), (pick_tie, "tie")):
        button.click(press_pick(choice), run_state, ab_outputs, **private)
    ab_end_btn.click(press_reveal, run_state, ab_outputs, **private)
