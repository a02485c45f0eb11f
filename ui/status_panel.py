"""The warm-up status panel on top of every tab: banner and bar, the per-task table, the details."""

from __future__ import annotations

import gradio as gr

from neuron_backend.runtime import Backend

from .api import user_errors
from .header import header_html
from .i18n import t
from .image_tab import ImageTab, size_choices
from .status_text import counters_lines, task_rows

TASK_HEADERS = ["task", "shape", "state", "seconds", "compile cache", "error"]


def details_markdown(status: dict) -> str:
    """The 'Warm-up details' text: what runs where, engine states, cache folder, versions."""
    device = status["device"]
    lines = [f"**Runs on:** {status['banner']}", f"**Models:** {status['models_reason']}",
             f"**Device:** {device['accelerator']}"]
    for name, engine in status["engines"].items():
        lines.append(f"**{name} engine:** {engine['state']}" + (f" — {engine['reason']}" if engine["reason"] else ""))
    lines.append(f"**Compile cache:** `{status['cache_dir']}/compile-cache`"
                 + (f" ⚠ {status['cache_problem']}" if status["cache_problem"] else ""))
    lines.append(f"**Graph compiles after warm-up:** {status['compiles_since_ready']}")
    lines += counters_lines(status.get("counters"))  # which counter that is, memory per core, CPU fallbacks
    versions = ", ".join(f"{k} {v}" for k, v in device["versions"].items())
    lines.append(f"**Software:** {versions}")
    return "\n\n".join(lines)


def build_status_panel(backend: Backend) -> list:
    """The bar and the details accordion; returns the components the refresh writes (see wire_refresh)."""
    status_bar = gr.HTML(header_html(backend.status()), elem_id="status-bar")  # title, chips, notice, bar
    with gr.Accordion(t("status_details"), open=False, elem_id="warmup-details"):
        tasks_table = gr.Dataframe(headers=TASK_HEADERS, value=task_rows(backend.status()),
                                   interactive=False, wrap=True, elem_id="warmup-table")
        details = gr.Markdown(elem_id="warmup-details-text")
        with gr.Row():
            bundle_btn = gr.Button(t("status_export_bundle"), size="sm",
                                   elem_id="export-bundle")
            bundle_file = gr.File(label=t("status_bundle_file"),
                                  height=90, elem_id="bundle-file")

        @user_errors
        def press_export_bundle():
            return str(backend.warm_start.export())

        bundle_btn.click(press_export_bundle, None, bundle_file, api_visibility="private")
    return [status_bar, tasks_table, details]


def wire_refresh(demo: gr.Blocks, backend: Backend, panel: list, image: ImageTab) -> None:
    """Poll the backend: every second while warming up, every 5 s after; also on page load."""
    timer = gr.Timer(1.0)

    def refresh_status(previous_choices):
        status = backend.status()
        choices = size_choices(backend)
        size_update = gr.update(choices=choices) if choices != previous_choices else gr.skip()
        timer_update = gr.Timer(active=True, value=5.0 if status.get("warmup_done", status["ready"]) else 1.0)
        return (header_html(status), task_rows(status), details_markdown(status), size_update, choices,
                timer_update, gr.update(visible=not backend.image_distilled()))

    size_choices_state = gr.State(size_choices(backend))
    outputs = [*panel, image.size, size_choices_state, timer, image.guidance]
    timer.tick(refresh_status, size_choices_state, outputs, queue=False, api_visibility="private")
    demo.load(refresh_status, size_choices_state, outputs, queue=False, api_visibility="private")
    # The model's own default steps, once per page (never on a tick: it would undo the visitor's choice).
    def model_default_steps():
        return gr.update(value=backend.image_default_steps())

    demo.load(model_default_steps, None, image.steps, queue=False, api_visibility="private")
