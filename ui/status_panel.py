"""The warm-up status panel on top of every tab: banner and bar, the per-task table, the details."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gradio as gr

from neuron_backend.engine import engine_name
from neuron_backend.runtime import Backend

from .header import header_html
from .i18n import localized, say, t
from .image_tab import ImageTab, size_choices
from .status_text import counters_lines, ltr_runs, state_word, task_rows

TASK_COLUMNS = ["task", "shape", "state", "seconds", "compile cache", "error"]  # English: the API's words
# Fixed shares of the table's width. Without them Gradio 6.31 sizes each column by its longest cell: "state"
# (a model folder, a memory estimate) took ~1200 px, the table ~1900 px, and the last columns were left 32 px,
# where wrap=True broke "compile cache" one letter a line (a ~270 px tall header) behind a side scroll.
TASK_WIDTHS = ["22%", "10%", "34%", "8%", "11%", "15%"]


def task_headers() -> list[str]:
    """The task table's headers in the page's language (a Dataframe's headers are plain strings)."""
    return [say(column) for column in TASK_COLUMNS]


def task_table(status: dict) -> dict:
    """The task table's value, headers included, so the page's language reaches them on every refresh."""
    return {"headers": task_headers(), "data": task_rows(status)}


def details_markdown(status: dict, show_paths: bool = True) -> str:
    """The 'Warm-up details' text: what runs where, engine states, cache folder, versions.

    Without ``show_paths`` (no --auth: anonymous visitors) the cache folder is named, not its server path.
    """
    device = status["device"]
    lines = [say("**Runs on:** {banner}", banner=localized(status["banner"])),
             say("**Models:** {reason}", reason=localized(status["models_reason"])),
             say("**Device:** {device}", device=device["accelerator"])]
    for name, engine in status["engines"].items():
        state = say("disabled") if engine["state"] == "disabled" else \
            say(engine["state"]) if engine["state"] in ("ready", "loading", "failed") else \
            state_word(engine["state"])
        lines.append(say("**{engine} engine:** {state}", engine=localized(engine_name(name)), state=state)
                     + (f" — {localized(engine['reason'])}" if engine["reason"] else ""))
    root = status["cache_dir"] if show_paths else "<cache-dir>"
    lines.append(say("**Compile cache:** {folder}", folder=f"`{root}/compile-cache`")
                 + (f" ⚠ {localized(status['cache_problem'])}" if status["cache_problem"] else ""))
    lines.append(say("**Graph compiles after warm-up:** {n}", n=status["compiles_since_ready"]))
    lines += counters_lines(status.get("counters"))  # which counter that is, memory per core, CPU fallbacks
    versions = ", ".join(f"{k} {v}" for k, v in device["versions"].items())
    lines.append(say("**Software:** {versions}", versions=versions))
    return "\n\n".join(ltr_runs(line) for line in lines)


def build_status_panel(backend: Backend, details: Sequence[Callable[[Backend], object]] = ()) -> list:
    """The bar and the details accordion; returns the components the refresh writes (see wire_refresh).
    ``details``: what the annex adds inside the accordion (app.py hands in the compile-cache Export)."""
    status_bar = gr.HTML(header_html(backend.status()), elem_id="status-bar")  # title, chips, notice, bar
    with gr.Accordion(t("Warm-up details"), open=False, elem_id="warmup-details"):
        tasks_table = gr.Dataframe(headers=task_headers(), value=task_rows(backend.status()),
                                   interactive=False, wrap=True, column_widths=TASK_WIDTHS, elem_id="warmup-table")
        text = gr.Markdown(elem_id="warmup-details-text")
        for build in details:
            build(backend)
    return [status_bar, tasks_table, text]


def operator_actions(backend: Backend) -> bool:
    """Whether the page offers operator actions (cache export, server paths): only under --auth, where
    every request comes from a logged-in user."""
    return backend.settings.auth is not None


def wire_refresh(demo: gr.Blocks, backend: Backend, panel: list, image: ImageTab) -> None:
    """Poll the backend: every second while warming up, every 5 s after; also on page load."""
    timer = gr.Timer(1.0)

    def refresh_status(previous_choices):
        status = backend.status()
        choices = size_choices(backend)
        size_update = gr.update(choices=choices) if choices != previous_choices else gr.skip()
        timer_update = gr.Timer(active=True, value=5.0 if status.get("warmup_done", status["ready"]) else 1.0)
        return (header_html(status), task_table(status), details_markdown(status, operator_actions(backend)),
                size_update, choices,
                timer_update, gr.update(visible=not backend.image_distilled()))

    size_choices_state = gr.State(size_choices(backend))
    outputs = [*panel, image.size, size_choices_state, timer, image.guidance]
    timer.tick(refresh_status, size_choices_state, outputs, queue=False, api_visibility="private")
    demo.load(refresh_status, size_choices_state, outputs, queue=False, api_visibility="private")
    # The model's own default steps, once per page (never on a tick: it would undo the visitor's choice).
    def model_default_steps():
        return gr.update(value=backend.image_default_steps())

    demo.load(model_default_steps, None, image.steps, queue=False, api_visibility="private")
