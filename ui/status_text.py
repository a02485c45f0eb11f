"""The warm-up bar, task table, counters and size labels as text, built from the status snapshot
(no Gradio here, so it is testable on its own). Names from settings or the backend go through ``html.escape``."""

from __future__ import annotations

import html

STATE_ICONS = {"queued": "⏳", "running": "⚙️", "ready": "✅", "failed": "❌", "skipped": "⏭️"}


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"


def status_bar_html(status: dict) -> str:
    """The compact warm-up bar on top of every tab: progress, ETA and the recompile alarm."""
    pct = round(100 * status["progress"])
    if status.get("warmup_done", status["ready"]):  # "ready" also needs every engine serving
        failed = len(status["failed"])
        state = f"Warm-up done in {fmt_seconds(status['elapsed_s'])}" + (f" · {failed} failed" if failed else "")
    else:
        eta = status["eta_s"]
        running = next((t["name"] for t in status["tasks"] if t["state"] == "running"), "starting")
        state = f"Warming up: {html.escape(running)} · {status['done']}/{status['total']} tasks" + (
            f" · about {fmt_seconds(eta)} left" if eta is not None else " · ETA learned after the first start"
        )
    alarm = status["compiles_since_ready"]
    alarm_html = (
        f'<span class="recompile-alarm" style="color:#fff;background:#c62828;padding:1px 6px;border-radius:4px">'
        f"⚠ {alarm} graph compile(s) after warm-up</span>"
        if alarm
        else '<span class="recompile-quiet">no recompiles</span>'
    )
    # What runs where (the banner) and the demo notice sit in the page header (header.py) and the details.
    return (
        '<div id="warmup-bar">'
        f'<div style="display:flex;gap:12px;align-items:center">'
        f'<progress id="warmup-progress" value="{pct}" max="100" style="flex:1"></progress>'
        f'<span id="warmup-state">{state}</span> {alarm_html}</div>{fallback_html(status)}</div>'
    )


def fallback_html(status: dict) -> str:
    """A loud line per engine whose real model failed under --models auto and gave way to its demo model."""
    return "".join(
        f'<div class="fallback-alarm" style="color:#fff;background:#b26a00;padding:2px 6px;border-radius:4px;'
        f'margin-top:4px">⚠ {html.escape(name)}: the real model failed, so its demo model (random weights) '
        f"runs instead: {html.escape(reason)}</div>"
        for name, reason in (status.get("fallbacks") or {}).items())


def task_rows(status: dict) -> list[list]:
    """Rows for the per-task table: task, shape, state, seconds, cache hit, error."""
    rows = []
    for t in status["tasks"]:
        seconds = t["seconds"]  # measured only; what a task is expected to take goes with its state
        hit = {True: "hit", False: "miss", None: ""}[t["cache_hit"]]
        if t.get("from_bundle"):  # the shape's graphs came with a --cache-bundle
            hit = f"{hit} (bundle)" if hit else "from bundle"
        state = f"{STATE_ICONS.get(t['state'], '')} {t['state']}"
        if t["progress"] is not None and t["state"] == "running":
            state += f" {t['progress']:.0%}"
        if t.get("detail") and t["kind"] in ("weights", "load") and t["state"] in ("running", "ready"):
            state += f" · {t['detail']}"  # download bytes/rate, the model folder, the memory estimate
        if t.get("detail") and t["kind"] == "compile" and t["state"] == "ready":
            state += f" · {t['detail']}"  # "eager fallback: <the compile error>" (Neuron, devices.compile_or_eager)
        if t["state"] in ("queued", "running") and t["expected_s"] is not None:
            state += f" (expected {fmt_seconds(t['expected_s'])})"
        rows.append([t["name"], t["shape"] or "", state, "" if seconds is None else round(seconds, 1), hit,
                     t["error"] or ""])
    return rows


def counters_lines(counters: dict | None) -> list[str]:
    """Details lines: which compile counter the alarm shows, memory per device, ops that ran on the CPU."""
    if not counters:
        return []
    lines = [f"**Compile counter shown:** {counters['compile_counter']}"]
    for device, mem in counters["memory"].items():
        if "error" in mem:
            lines.append(f"**Memory {device}:** unavailable ({mem['error']})")
        else:
            lines.append(f"**Memory {device}:** {mem['allocated_bytes'] / 2**30:.2f} GiB allocated of "
                         f"{mem['total_bytes'] / 2**30:.1f} GiB")
    ops = counters["cpu_fallback_ops"]
    if ops is not None:
        lines.append("**Ops that fell back to CPU:** " + (", ".join(f"`{op}`" for op in ops) if ops else "none"))
    return lines


def size_choice_label(size, state: dict | None) -> str:
    """'1344x768 (7:4) · ready' for the size picker."""
    state = state or {"state": "queued", "eta_s": None, "error": None}
    text = {"ready": "ready", "failed": "failed", "skipped": "unavailable"}.get(state["state"])
    if text is None:  # only the running task compiles; the others wait their turn
        eta = state.get("eta_s")
        text = ("compiling" if state["state"] == "running" else "queued") + (f", ~{fmt_seconds(eta)}" if eta else "")
    return f"{size.label} ({size.aspect}) · {text}"
