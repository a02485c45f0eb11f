"""The warm-up bar, task table, counters and size labels as text, built from the status snapshot
(no Gradio here, so it is testable on its own). Names from settings or the backend go through ``html.escape``.

Every text is built with ``say`` in the page's language (ui/i18n.py); the backend's task names, errors and
details are messages (neuron_backend/messages.py) shown with ``localized``. The snapshot stays English.
"""

from __future__ import annotations

import html
import re

from neuron_backend.engine import engine_name

from .i18n import lang, localized, say

STATE_ICONS = {"queued": "⏳", "running": "⚙️", "ready": "✅", "failed": "❌", "skipped": "⏭️"}


# Left-to-right runs inside Arabic text: flags, paths, commands, model ids ("--models tiny", "/data/compile-cache",
# "Qwen3-0.6B"). Drawn in a right-to-left paragraph, their leading or trailing "-", "/", "." and spaces resolve to
# the paragraph's direction and the run reads jumbled ("(tiny --models)"); an isolate keeps each run in one piece.
LRI, PDI = "\u2066", "\u2069"  # Unicode's left-to-right isolate (plain text: a Dataframe cell, Markdown)
_PIECE = r"(?:[A-Za-z0-9_./:~@=+#%`\\'-]|\(\)|&(?:lt|gt|amp|quot|#\d+);|<[\w-]+>)+"
_RUN = re.compile(rf"{_PIECE}(?: {_PIECE})*")
_HTML_TAG = re.compile(r"(<[^>]*>)")


def _isolate(match: re.Match, markup: bool) -> str:
    run = match.group(0)
    core = run.rstrip(".,:;'")
    if not re.search(r"[A-Za-z]", core) or re.fullmatch(r"[A-Za-z0-9 ]+", core):
        return run  # a number, plain words ("cpu", "Hugging Face"): no "-", "/", "." at an edge to misplace
    tail = run[len(core):]
    return (f'<bdi dir="ltr">{core}</bdi>' if markup else f"{LRI}{core}{PDI}") + tail


def ltr_runs(text: str, markup: bool = False) -> str:
    """``text`` with its Latin technical runs in left-to-right isolates, on an Arabic page only (English as it is).

    ``markup``: ``text`` is HTML, runs go in ``<bdi dir="ltr">`` (tags and entities left whole); otherwise
    (a table cell, Markdown) between LRI and PDI.
    """
    if lang() != "ar" or not text:
        return text
    if not markup:
        return _RUN.sub(lambda m: _isolate(m, False), text)
    parts = _HTML_TAG.split(text)
    return "".join(part if i % 2 else _RUN.sub(lambda m: _isolate(m, True), part) for i, part in enumerate(parts))


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return say("{n} s", n=f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}")
    return say("{m} min {s} s", m=f"{seconds // 60:.0f}", s=f"{seconds % 60:02.0f}")


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
        eta = status["eta_s"]
        running = next((localized(t["name"]) for t in status["tasks"] if t["state"] == "running"),
                       say("starting"))
        state = say("Warming up: {task} · {done}/{total} tasks",
                    task=html.escape(running), done=status["done"], total=status["total"]) + (
            say(" · about {eta} left", eta=fmt_seconds(eta)) if eta is not None else
            say(" · ETA learned after the first start")
        )
    alarm = status["compiles_since_ready"]
    alarm_html = (
        f'<span class="recompile-alarm" style="color:#fff;background:#c62828;padding:1px 6px;border-radius:4px">'
        f"{say('⚠ {n} graph compile(s) after warm-up', n=alarm)}</span>"
        if alarm
        else f'<span class="recompile-quiet">{say("no recompiles")}</span>'
    )
    # What runs where (the banner) and the demo notice sit in the page header (header.py) and the details.
    return (
        '<div id="warmup-bar">'
        f'<div style="display:flex;gap:12px;align-items:center">'
        f'<progress id="warmup-progress" value="{pct}" max="100" style="flex:1"></progress>'
        f'<span id="warmup-state">{ltr_runs(state, True)}</span> {alarm_html}</div>'
        f'{ltr_runs(fallback_html(status), True)}</div>'
    )


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
    for t in status["tasks"]:
        seconds = t["seconds"]  # measured only; what a task is expected to take goes with its state
        hit = {True: say("hit"), False: say("miss"), None: ""}[t["cache_hit"]]
        if t.get("from_bundle"):  # the shape's graphs came with a --cache-bundle
            hit = say("{hit} (bundle)", hit=hit) if hit else say("from bundle")
        state = f"{STATE_ICONS.get(t['state'], '')} {state_word(t['state'])}"
        if t["progress"] is not None and t["state"] == "running":
            state += f" {t['progress']:.0%}"
        if t.get("detail") and t["kind"] in ("weights", "load") and t["state"] in ("running", "ready"):
            state += f" · {localized(t['detail'])}"  # download bytes/rate, the model folder, the memory estimate
        if t.get("detail") and t["kind"] in ("compile", "bundle") and t["state"] == "ready":
            state += f" · {localized(t['detail'])}"  # "eager fallback: <error>" (devices.compile_or_eager), the bundle
        if t["state"] in ("queued", "running") and t["expected_s"] is not None:
            state += say(" (expected {eta})", eta=fmt_seconds(t["expected_s"]))
        rows.append([ltr_runs(localized(t["name"])), t["shape"] or "", ltr_runs(state),
                     "" if seconds is None else round(seconds, 1), hit, ltr_runs(localized(t["error"] or ""))])
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


def size_choice_label(size, state: dict | None) -> str:
    """'1344x768 (7:4) · ready' for the size picker."""
    state = state or {"state": "queued", "eta_s": None, "error": None}
    key = {"ready": "ready", "failed": "failed",
           "skipped": "unavailable"}.get(state["state"])
    if key is not None:
        text = say(key)
    else:  # only the running task compiles; the others wait their turn
        eta = state.get("eta_s")
        text = say("compiling" if state["state"] == "running" else "queued")
        text = say("{state}, ~{eta}", state=text, eta=fmt_seconds(eta)) if eta else text
    return f"{size.label} ({size.aspect}) · {text}"
