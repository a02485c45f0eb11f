"""The warm-up status panel on top of every tab: the header (title, engine chips, demo notice), the
warm-up bar with its recompile alarm, the per-task table and the details; the timer that refreshes them.

Text is built from ``Backend.status()`` in the page's language, technical runs left to right (``ltr_runs``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence

import gradio as gr

from neuron_backend.messages import ltr_isolated
from neuron_backend.runtime import Backend
from neuron_backend.shapes import engine_name

from .i18n import LANGUAGES, bilingual_html, lang, localized, say, speaking, t
from .image_tab import ImageTab, size_choices
from .presentation import fmt_seconds, operator_view, visitor_status

STATE_ICONS = {"queued": "⏳", "running": "⚙️", "ready": "✅", "failed": "❌", "skipped": "⏭️"}


_HUB_REVISION = re.compile(r"[^/@]+/(?P<name>[^/@]+)@(?P<revision>[^@]+)")  # a hub id, not a folder ("/", "@")
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a commit sha, shown by its first 7 digits as git does


def ltr_runs(text: str, markup: bool = False) -> str:
    """``text`` with its Latin technical runs isolated on an Arabic page only (English as it is): in
    ``<bdi dir="ltr">`` when ``markup`` (HTML), else between LRI and PDI (a table cell, Markdown)."""
    return ltr_isolated(text, markup) if lang() == "ar" else text


# What holds the page still while Gradio mounts it (docs/page.md, "A page that holds still"). Classes, not ids:
# the first paint's Arabic copy carries no ids.
STATUS_CSS = """
@media (max-width: 640px) {
  .warmup-row { flex-wrap: wrap; }
  .warmup-row > progress { flex: 1 1 100% !important; }  /* over its inline flex: 1 */
  .warmup-state { flex: 1 1 0; min-height: 2lh; display: flex; align-items: center; }
}
@media (min-width: 641px) {  /* the bar keeps its length whatever the line beside it says */
  .warmup-row > progress { flex: 0 0 55% !important; }  /* the main thing in the row: over half of it */
  .warmup-state { flex: 1 1 0; min-width: 0; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
}
footer img { width: 12px; height: 12px; }
.gradio-container > .main > [data-testid="status-tracker"] { display: none !important; }
#warmup-details { visibility: hidden; }
#status-bar ~ #warmup-details { visibility: visible; }
.gradio-container > .main > .wrap > main { min-height: 100vh; }
"""


def state_word(state: str) -> str:
    """A task's state (queued, running, ready, failed, skipped) in the page's language."""
    return say(state)  # a state the catalog does not know reads as it is


def engine_title(name: str) -> str:
    """"Chat", "Image" (the chips, the details), in the page's language."""
    return say(name.title())


def status_bar_html(status: dict) -> str:
    """The compact warm-up bar on top of every tab: progress, ETA and the recompile alarm."""
    pct = round(100 * status["progress"])
    if status.get("warmup_done", status["ready"]):  # "ready" also needs every engine serving
        failed = len(status["failed"])
        state = say("Warm-up done in {elapsed}", elapsed=fmt_seconds(status["elapsed_s"])) + (
            say(" · {n} failed", n=failed) if failed else "")
    else:
        eta, plan = status["eta_s"], status.get("plan")
        task = next((t for t in status["tasks"] if t["state"] == "running"), None)
        running = localized(task["name"]) if task else say("starting")
        state = say("Warming up: {task} · {done}/{total} tasks",
                    task=html.escape(running), done=status["done"], total=status["total"]) + (
            say(" · about {eta} left", eta=fmt_seconds(eta)) if eta is not None and eta >= 1.0 else
            say(" · almost done") if eta is not None else  # learned times under a second: not "0.0 s left"
            # an eager first start has nothing to estimate (loads are not): no "0.0 s left" with tasks to go
            say(" · about {eta} left by the first-run estimate", eta=fmt_seconds(plan["eta_s"]))
            if plan and plan["eta_s"] else
            say(" · ETA learned after the first start")
        ) + (still_compiling(task, plan) if task else "")
    alarm = status["compiles_since_ready"]
    alarm_html = (
        f'<span class="recompile-alarm" style="color:#fff;background:#c62828;padding:1px 6px;border-radius:4px">'
        f"{say('⚠ {n} graph compile(s) after warm-up', n=alarm)}</span>"
        if alarm
        else f'<span class="recompile-quiet">{say("no recompiles")}</span>'
    )
    # What runs where (the banner) and the demo notice sit in the page header (above) and the details.
    return (
        '<div id="warmup-bar">'
        f'<div class="warmup-row" style="display:flex;gap:12px;align-items:center">'
        f'<progress id="warmup-progress" value="{pct}" max="100" style="flex:1"></progress>'
        f'<span id="warmup-state" class="warmup-state">{ltr_runs(state, True)}</span> {alarm_html}</div>'
        f'{plan_html(status)}{ltr_runs(fallback_html(status), True)}</div>'
    )


IDLE_SHOWN_S = 30.0  # a compiler run this long without progress says so


def still_compiling(task: dict, plan: dict | None) -> str:
    """" · still compiling after 12 min 00 s (limit 60 min per graph)" for a compile task past its expected time,
    then which neuronx-cc run of the task is compiling and for how long (compilers.CompileWatch), else ""."""
    run = task.get("compiling")
    now = say(" · neuronx-cc run {run} compiling for {elapsed}", run=run["run"],
              elapsed=fmt_seconds(run["seconds"])) if run else ""
    if run and run["idle_s"] >= IDLE_SHOWN_S:
        now += say(" (no progress for {idle})", idle=fmt_seconds(run["idle_s"]))
    if not task.get("still_compiling"):
        return now
    limit = (plan or {}).get("compile_timeout_s")
    return say(" · still compiling after {elapsed}", elapsed=fmt_seconds(task["seconds"])) + (
        say(" (limit {limit} per graph)", limit=fmt_seconds(limit)) if limit else "") + now


def plan_html(status: dict) -> str:
    """The compile plan per engine (graphs, eager programs): with the first-run estimate while warming up, as
    what was warmed up once done. One line in both states (cut with an ellipsis where it does not fit, the
    details say it whole), so the page below does not move when warm-up ends."""
    plan = status.get("plan")
    if not plan or not plan["engines"]:
        return ""
    parts = [say("{engine}: {graphs} graphs, {programs} eager programs", engine=engine_title(name),
                 graphs=e["graphs"], programs=e["eager_programs"]) if e["graphs"] or e["eager_programs"] else
             say("{engine}: nothing to compile (eager)", engine=engine_title(name))
             for name, e in plan["engines"].items()]
    if status.get("warmup_done", status["ready"]):
        line = say("Warmed up: {engines}", engines="; ".join(parts))
    else:
        estimate = sum(e["estimate_s"] for e in plan["engines"].values())
        if round(estimate, 1) > 0:
            line = say("Compile plan: {engines} · first run about {estimate} by estimate (learned times replace it)",
                       engines="; ".join(parts), estimate=fmt_seconds(estimate))
        else:  # nothing to compile (eager, the demo models on a CPU): no estimate of "about 0.0 s"
            line = say("Compile plan: {engines}", engines="; ".join(parts))
    return (f'<div id="warmup-plan" style="font-size:.9em;opacity:.85;white-space:nowrap;overflow:hidden;'
            f'text-overflow:ellipsis">{ltr_runs(line, True)}</div>')


def fallback_html(status: dict) -> str:
    """A loud line per engine whose real model failed under --models auto and gave way to its demo model."""
    lines = [say("⚠ {engine}: the real model failed, so its demo model (random weights) runs instead: {reason}",
                 engine=html.escape(localized(engine_name(name))),
                 reason=html.escape(localized(reason))) for name, reason in (status.get("fallbacks") or {}).items()]
    return "".join(
        f'<div class="fallback-alarm" style="color:#fff;background:#b26a00;padding:2px 6px;border-radius:4px;'
        f'margin-top:4px">{line}</div>' for line in lines)


def task_rows(status: dict) -> list[list]:
    """Rows for the per-task table: task, shape, state, seconds, cache hit, error."""
    rows = []
    for task in status["tasks"]:
        seconds = task["seconds"]  # measured only; what a task is expected to take goes with its state
        hit = {True: say("hit"), False: say("miss"), None: ""}[task["cache_hit"]]
        if task.get("from_bundle"):  # the shape's graphs came with a --cache-bundle
            hit = say("{hit} (bundle)", hit=hit) if hit else say("from bundle")
        state = f"{STATE_ICONS.get(task['state'], '')} {state_word(task['state'])}"
        if task["progress"] is not None and task["state"] == "running":
            state += f" {task['progress']:.0%}"
        if task.get("detail") and task["kind"] in ("weights", "load") and task["state"] in ("running", "ready"):
            state += f" · {localized(task['detail'])}"  # download bytes/rate, the model folder, the memory estimate
        if task.get("detail") and task["kind"] in ("compile", "bundle") and task["state"] == "ready":
            # "eager fallback: …" (devices.compile_or_eager; chat: which graph, devices.GraphFallbacks),
            # the bundle's summary
            state += f" · {localized(task['detail'])}"
        if task["state"] in ("queued", "running") and task["expected_s"] is not None:
            state += say(" (expected {eta})", eta=fmt_seconds(task["expected_s"]))
        elif task["state"] in ("queued", "running") and task.get("estimate_s"):
            state += say(" (first-run estimate {eta})", eta=fmt_seconds(task["estimate_s"]))
        if task["state"] == "running":
            state += still_compiling(task, status.get("plan"))
        rows.append([ltr_runs(localized(task["name"])), task["shape"] or "", ltr_runs(state),
                     "" if seconds is None else round(seconds, 1), hit, ltr_runs(localized(task["error"] or ""))])
    return rows


def counters_lines(counters: dict | None) -> list[str]:
    """Details lines: which compile counter the alarm shows, memory per device, ops that ran on the CPU."""
    if not counters:
        return []
    lines = [say("**Compile counter shown:** {counter}", counter=localized(counters["compile_counter"]))]
    for device, mem in counters["memory"].items():
        if "error" in mem:
            lines.append(say("**Memory {device}:** unavailable ({error})",
                             device=device, error=localized(mem["error"])))
        else:
            lines.append(say("**Memory {device}:** {used} GiB allocated of {total} GiB",
                             device=device, used=f"{mem['allocated_bytes'] / 2**30:.2f}",
                             total=f"{mem['total_bytes'] / 2**30:.1f}"))
    ops = counters["cpu_fallback_ops"]
    if ops is not None:
        lines.append(say("**Ops that fell back to CPU:** {ops}",
                         ops=", ".join(f"`{op}`" for op in ops) if ops else say("none")))
    return lines


# ----- the header: title, engine chips, demo notice, the bar ---------------------------------------------
# both languages (ui/i18n.py); CSS shows the one of <html lang>
TITLE = bilingual_html("Hugging Face models on AWS Trainium")
# the model each engine was specified with: what the demo's tiny stand-ins stand in for
SPECIFIED = {"chat": "Qwen3-0.6B", "image": "FLUX.2-klein-4B"}
# chip state -> (text colour, background)
CHIP_COLOURS = {"ready": ("#1b5e20", "#e8f5e9"), "warming up": ("#8a5300", "#fff4e0"),
                "loading": ("#8a5300", "#fff4e0"), "failed": ("#b71c1c", "#fdecea")}
CHIP_STYLE = "padding:2px 10px;border-radius:999px;font-size:.9em;border:1px solid currentColor"
NOTICE_STYLE = ("padding:8px 12px;margin-bottom:8px;border-radius:6px;color:#5d3a00;background:#fff3cd;"
                "border-left:5px solid #e0a000")


def _short_model(model_id: str, demo: bool, engine: str) -> str:
    if demo:
        return say("demo {family} (tiny)", family="Qwen3" if engine == "chat" else "FLUX.2-klein")
    if model_id != localized(model_id):  # a message: a demo model after a --models auto fallback
        return localized(model_id)
    if pinned := _HUB_REVISION.fullmatch(model_id):  # org/name@revision: a revision may hold "/" (refs/pr/1)
        revision = pinned["revision"]
        return f"{pinned['name']}@{revision[:7] if _COMMIT.fullmatch(revision) else revision}"
    return model_id.rstrip("/").split("/")[-1]


def _demo_here(status: dict, engine: str) -> bool:
    """Whether this server runs ``engine`` on its demo model (a remote engine's model is the server's own)."""
    return status["demo"] and status["device"]["engines"].get(engine, {}).get("kind") != "remote"


def engine_chips(status: dict) -> list[tuple[str, str]]:
    """(state, text) per enabled engine, e.g. ("ready", "Chat · Qwen3-0.6B · neuron:0 · ready")."""
    chips = []
    for name, model_id in status["models"].items():
        engine = status["engines"].get(name, {"state": "loading"})
        state = engine["state"]
        if state == "disabled":
            continue
        if state == "ready" and any(t["engine"] == name and t["state"] in ("queued", "running")
                                    for t in status["tasks"]):
            state = "warming up"  # loaded and serving its warm shapes; others still compile
        device = status["device"]["engines"].get(name, {}).get("device", "?")
        words = say(state) if state in CHIP_COLOURS else state
        parts = [engine_title(name), _short_model(model_id, _demo_here(status, name), name), device, words]
        chips.append((state, " · ".join(parts)))
    return chips


def demo_notice_html(status: dict) -> str:
    """The coloured notice shown while the demo models run (empty otherwise)."""
    if not status["demo"]:
        return ""
    notice = say("<b>Demo models: replies and images are noise.</b> This server runs tiny stand-ins with random "
                 "weights, built offline (why: {why}). Shapes, timings and code paths are the real ones; with the "
                 "real weights cached, <code>--models "
                 "full</code> gives real output.", why=html.escape(localized(status["models_reason"])))
    return f'<div class="demo-notice" id="demo-notice" style="{NOTICE_STYLE}">{ltr_runs(notice, True)}</div>'


def summary_text(status: dict) -> str:
    """One sentence naming what this page runs: the enabled engines and their models."""
    names = {}
    for name, model_id in status["models"].items():
        if status["engines"].get(name, {}).get("state") == "disabled":
            continue
        # a local folder's name, without the <...> that marks a hidden server folder
        names[name] = SPECIFIED[name] if _demo_here(status, name) else _short_model(model_id, False, name).strip("<>")
    if "chat" in names and "image" in names:
        return say("Chat with {chat} and draw with {image}, run natively on Trainium through PyTorch's neuron device: "
                   "every shape is compiled once at start, so after warm-up no request waits for a compile.", **names)
    if "chat" in names:
        return say("Chat with {chat}, run natively on Trainium through PyTorch's neuron device: every shape is "
                   "compiled once at start, so after warm-up no request waits for a compile.", **names)
    return say("Draw with {image}, run natively on Trainium through PyTorch's neuron device: every shape is "
               "compiled once at start, so after warm-up no request waits for a compile.", **names)


def header_html(status: dict) -> str:
    """Title, summary, engine chips, demo notice and the warm-up bar."""
    chips = []
    for state, text in engine_chips(status):
        colour, background = CHIP_COLOURS.get(state, ("#444", "#f0f0f0"))
        chips.append(f'<span class="chip" data-state="{html.escape(state)}" '
                     f'style="{CHIP_STYLE};color:{colour};background:{background}">'
                     f'{ltr_runs(html.escape(text), True)}</span>')
    return (f'<div id="page-header"><h1 style="margin:0 0 2px 0;font-size:1.6em">{TITLE}</h1>'
            f'<p class="summary" style="margin:0 0 8px 0;opacity:.85">'
            f'{ltr_runs(html.escape(summary_text(status), quote=False), True)}</p>'
            f'<div class="chips" id="engine-chips" style="display:flex;flex-wrap:wrap;gap:8px;margin-bottom:8px">'
            f'{"".join(chips)}</div>{demo_notice_html(status)}{status_bar_html(status)}</div>')


def first_paint_html(status: dict) -> str:
    """The header as the page first paints it, before its first refresh: every language, CSS showing the one of
    ``<html lang>`` (built outside an event, there is no visitor's language). Only the English copy carries
    the ids, which the refresh's single-language header then keeps. An Arabic visitor thus never sees the
    English header first, nor the page move when the Arabic one, of another height, replaces it."""
    copies = []
    for language in LANGUAGES:
        with speaking(language):
            shown = header_html(status)
        if language != "en":
            shown = re.sub(r' id="[^"]*"', "", shown)
        copies.append(f'<div class="i18n-{language}" lang="{language}">{shown}</div>')
    return "".join(copies)


# ----- the panel: bar, task table, details; the refresh ---------------------------------------------------
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
    ``details``: what plug-ins add inside the accordion (the compile-cache Export)."""
    status_bar = gr.HTML(first_paint_html(visitor_status(backend)), elem_id="status-bar")  # title, chips, notice, bar
    with gr.Accordion(t("Warm-up details"), open=False, elem_id="warmup-details"):
        tasks_table = gr.Dataframe(headers=task_headers(), value=task_rows(visitor_status(backend)),
                                   interactive=False, wrap=True, column_widths=TASK_WIDTHS, elem_id="warmup-table")
        text = gr.Markdown(elem_id="warmup-details-text")
        for build in details:
            build(backend)
    return [status_bar, tasks_table, text]


def operator_actions(backend: Backend) -> bool:
    """Whether the page offers operator actions (cache export, server paths): only under --auth."""
    return operator_view(backend.settings)


def wire_refresh(demo: gr.Blocks, backend: Backend, panel: list, image: ImageTab) -> None:
    """Poll the backend: every second while warming up, every 5 s after; also on page load."""
    timer = gr.Timer(1.0)

    def refresh_status(previous_choices):
        status = visitor_status(backend)
        choices = size_choices(backend)
        size_update = gr.update(choices=choices) if choices != previous_choices else gr.skip()
        timer_update = gr.Timer(active=True, value=5.0 if status.get("warmup_done", status["ready"]) else 1.0)
        return (header_html(status), task_table(status), details_markdown(status, operator_actions(backend)),
                size_update, choices,
                timer_update, gr.update(visible=not backend.image_distilled()))

    size_choices_state = gr.State(size_choices(backend))
    outputs = [*panel, image.size, size_choices_state, timer, image.guidance]
    # No progress overlay: a spinner over the header on every poll would cover it and, at page load, move.
    timer.tick(refresh_status, size_choices_state, outputs, queue=False, api_visibility="private",
               show_progress="hidden")
    demo.load(refresh_status, size_choices_state, outputs, queue=False, api_visibility="private",
              show_progress="hidden")
    # The model's own default steps, once per page (never on a tick: it would undo the visitor's choice). On a
    # busy host this load can end after the visitor has typed a number, and either its pending overlay or an
    # update that repeats the value puts the old number back: so no overlay, and nothing sent while the value
    # is the one the page was built with (the model's own whenever its model_index.json was on disk then).
    def model_default_steps():
        steps = backend.image_default_steps()
        return gr.update(value=steps) if steps != image.steps.value else gr.skip()

    demo.load(model_default_steps, None, image.steps, queue=False, api_visibility="private",
              show_progress="hidden")
