"""The top of every page, built from the status snapshot (no Gradio here, so it is testable on its own).

A title and one sentence on what this is; one status chip per engine ("Chat · Qwen3-0.6B · neuron:0 ·
ready"); on the demo models a coloured notice that their output is noise, and why; then the warm-up
bar. Details (the full banner, task table, versions) stay one click away in "Warm-up details".
Everything that comes from settings or the model goes through ``html.escape``.
"""

from __future__ import annotations

import html

from .i18n import bilingual_html, localized, say
from .status_text import engine_title, ltr_runs, status_bar_html

# both languages (ui/i18n.py); CSS shows the one of <html lang>
TITLE = bilingual_html("Hugging Face models on AWS Trainium")
SUMMARY = bilingual_html("Chat with Qwen3-0.6B and draw with FLUX.2-klein-4B, run natively on Trainium through "
                         "PyTorch's neuron device: every shape is compiled once at start, so after warm-up no request "
                         "waits for a compile.")
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
    return model_id.rstrip("/").split("/")[-1]


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
        parts = [engine_title(name), _short_model(model_id, status["demo"], name), device, words]
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


def header_html(status: dict) -> str:
    """Title, summary, engine chips, demo notice and the warm-up bar."""
    chips = []
    for state, text in engine_chips(status):
        colour, background = CHIP_COLOURS.get(state, ("#444", "#f0f0f0"))
        chips.append(f'<span class="chip" data-state="{html.escape(state)}" '
                     f'style="{CHIP_STYLE};color:{colour};background:{background}">'
                     f'{ltr_runs(html.escape(text), True)}</span>')
    return (f'<div id="page-header"><h1 style="margin:0 0 2px 0;font-size:1.6em">{TITLE}</h1>'
            f'<p class="summary" style="margin:0 0 8px 0;opacity:.85">{SUMMARY}</p>'
            f'<div class="chips" id="engine-chips" style="display:flex;flex-wrap:wrap;gap:8px;margin-bottom:8px">'
            f'{"".join(chips)}</div>{demo_notice_html(status)}{status_bar_html(status)}</div>')
