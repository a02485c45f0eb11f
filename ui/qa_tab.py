"""The QA bench tab: run a prompt set under a few settings variants, mark cells, export, compare.

Only UI wiring; the work is in ``neuron_backend.qa.runs`` and ``neuron_backend.qa.report``.
"""

from __future__ import annotations

import threading

import gradio as gr

from neuron_backend.errors import ShowcaseError
from neuron_backend.qa import grid as qa_grid
from neuron_backend.qa import report as qa_report
from neuron_backend.qa import runs as qa
from neuron_backend.runtime import Backend

VARIANTS_HINT = "cold: temperature=0.2, seed=1\nhot: temperature=1.2, seed=1"


def _fail(exc: ShowcaseError):
    raise gr.Error(str(exc)) from None


def _file_path(upload) -> str | None:
    if upload is None:
        return None
    return upload if isinstance(upload, str) else getattr(upload, "name", None)


def _view(run):
    """The grid and gallery of a run."""
    if run is None:
        return gr.update(value=None), []
    headers, rows = qa_grid.results_table(run)
    return gr.update(value=rows, headers=headers), qa_grid.gallery_items(run)


def build_qa_tab(backend: Backend) -> None:
    """Components and events of the QA bench tab (call inside a gr.Tab)."""
    settings = backend.settings
    stops: dict[str, threading.Event] = {}  # session -> stop event of its running set
    kinds = [k for k in ("chat", "image") if k in backend.placements] + (["both"] if len(backend.placements) == 2
                                                                          else [])
    run_state = gr.State(None)
    previous_state = gr.State(None)
    with gr.Row():
        with gr.Column():
            prompts = gr.Textbox(label="Prompts (one per line)", lines=5, elem_id="qa-prompts")
            upload = gr.File(label="…or a .jsonl / .csv / .txt file with a 'prompt' column",
                             file_types=[".jsonl", ".csv", ".txt"], elem_id="qa-upload")
        with gr.Column():
            kind = gr.Radio(kinds, value=kinds[0], label="Engine", elem_id="qa-kind")
            variants = gr.Textbox(label="Variants (name: key=value, …; one per line)", lines=4,
                                  placeholder=VARIANTS_HINT, elem_id="qa-variants")
            run_seed = gr.Number(label="Run seed (fixes every cell's seed)", value=0, precision=0)
            with gr.Row():
                run_btn = gr.Button("Run set", variant="primary", elem_id="qa-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="qa-stop")
    status = gr.Markdown(elem_id="qa-status")
    grid = gr.Dataframe(label="Results (prompt × variant)", interactive=False, wrap=True, elem_id="qa-grid")
    gallery = gr.Gallery(label="Images", columns=6, height=200, elem_id="qa-gallery")
    with gr.Row():
        cell_index = gr.Number(label="Cell # (click the grid; -1 = none)", precision=0, value=-1, elem_id="qa-cell")
        mark = gr.Radio(["pass", "fail", "unmarked"], label="Mark", value="unmarked", elem_id="qa-mark")
        comment = gr.Textbox(label="Comment", elem_id="qa-comment")
        save_mark_btn = gr.Button("Save mark", elem_id="qa-save-mark")
        rerun_btn = gr.Button("Re-run cell", elem_id="qa-rerun")
    with gr.Row():
        export_html_btn = gr.Button("Export HTML report", elem_id="qa-export-html")
        export_jsonl_btn = gr.Button("Export JSONL", elem_id="qa-export-jsonl")
        import_file = gr.File(label="Import a JSONL run", file_types=[".jsonl"], elem_id="qa-import")
        compare_btn = gr.Button("Run it again and compare", elem_id="qa-compare")
    export_file = gr.File(label="Export", height=90, elem_id="qa-export-file")
    compare_grid = gr.Dataframe(label="What changed (after 'Run it again and compare')", interactive=False, wrap=True,
                                headers=["cell", "change"], elem_id="qa-compare-grid")

    def press_run(text, upload_value, kind_value, variants_text, seed, request: gr.Request,
                  progress=gr.Progress()):
        try:
            run = qa.plan_run(settings, prompts_text=text or None, prompts_file=_file_path(upload_value),
                              variants=variants_text or None, kind=kind_value, run_seed=int(seed or 0))
        except ShowcaseError as exc:
            _fail(exc)
        yield from _execute(run, request, progress)

    def _execute(run, request, progress):
        session = getattr(request, "session_hash", None) or "anonymous"
        stop = stops[session] = threading.Event()
        try:
            for p in qa.run_cells(backend, run, stop):
                eta = f" · ~{p.eta_s:.0f} s left" if p.eta_s is not None else ""
                progress((p.done, p.total), desc=f"{p.done}/{p.total} cells{eta}", unit="cells")
                yield run, *_view(run), f"{p.done}/{p.total} cells done{eta}"
        except ShowcaseError as exc:
            _fail(exc)
        finally:
            stops.pop(session, None)
        done = sum(c.status == "done" for c in run.cells)
        yield run, *_view(run), f"Finished: {done}/{len(run.cells)} cells done" + (" (stopped)" if stop.is_set()
                                                                                    else "")

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
            return -1, "unmarked", ""
        cell = run.cells[index]
        return index, cell.mark or "unmarked", cell.comment or ""

    def press_save_mark(run, index, mark_value, comment_value):
        if run is None or index is None or index < 0:
            raise gr.Error("Run a set (or import one) and pick a cell first.")
        try:
            qa.set_mark(run, int(index), None if mark_value in (None, "", "unmarked") else mark_value, comment_value)
        except ShowcaseError as exc:
            _fail(exc)
        return run, *_view(run)

    def press_rerun(run, index):
        if run is None or index is None or index < 0:
            raise gr.Error("Run a set (or import one) and pick a cell first.")
        try:
            qa.rerun_cell(backend, run, int(index))
        except ShowcaseError as exc:
            _fail(exc)
        return run, *_view(run)

    def press_export_html(run):
        if run is None:
            raise gr.Error("Nothing to export yet: run a set first.")
        return str(backend.exports.write(qa_report.export_html(run), ".html", "qa-run"))

    def press_export_jsonl(run):
        if run is None:
            raise gr.Error("Nothing to export yet: run a set first.")
        return str(backend.exports.write(qa_report.export_jsonl(run), ".jsonl", "qa-run"))

    def pick_import(upload_value):
        if upload_value is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        try:
            run = qa_report.read_run(_file_path(upload_value))
        except ShowcaseError as exc:
            _fail(exc)
        return run, run, *_view(run), f"Imported run {run.id}: {len(run.cells)} cells"

    def press_compare(previous, request: gr.Request, progress=gr.Progress()):
        if previous is None:
            raise gr.Error("Import a JSONL run first: the new run repeats its prompts, variants and seeds.")
        fresh = qa.new_run_like(previous)
        final = None
        for final in _execute(fresh, request, progress):
            yield *final, gr.skip()
        headers, rows = qa_report.compare_table(qa_report.compare_runs(previous, fresh))
        yield *final, gr.update(value=rows, headers=headers)

    private = {"api_visibility": "private"}
    outputs = [run_state, grid, gallery, status]
    # Its own queue slot: cells interleave with other tabs' requests at the engine (see qa.py).
    run_btn.click(press_run, [prompts, upload, kind, variants, run_seed], outputs, concurrency_limit=2,
                  concurrency_id="qa", **private)
    stop_btn.click(press_stop, None, None, queue=False, **private)
    grid.select(select_cell, run_state, [cell_index, mark, comment], **private)
    save_mark_btn.click(press_save_mark, [run_state, cell_index, mark, comment], [run_state, grid, gallery],
                        **private)
    rerun_btn.click(press_rerun, [run_state, cell_index], [run_state, grid, gallery], concurrency_id="qa",
                    **private)
    export_html_btn.click(press_export_html, run_state, export_file, **private)
    export_jsonl_btn.click(press_export_jsonl, run_state, export_file, **private)
    import_file.upload(pick_import, import_file, [run_state, previous_state, grid, gallery, status], **private)
    compare_btn.click(press_compare, previous_state, [*outputs, compare_grid], concurrency_id="qa", **private)
