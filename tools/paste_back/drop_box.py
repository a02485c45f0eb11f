"""The Image tab's "Restore settings from a PNG" box (Gradio; the plug-in, ``plugin.py``, hands ``build_drop_box`` to
the tab as an image extra): a dropped PNG fills the form with what it was made with, its note says where that came
from and what was adjusted, and a dropped edit sets the references' fit mode.

``/paste_png`` does the same for API clients (a hidden trigger, left off the "Use via API" page: docs/page.md,
"The Image tab underneath"): the same values, None where the PNG holds none, a refusal as a Gradio error; in the
page a refusal is one toast and the form stays as it was.
"""

from __future__ import annotations

import gradio as gr

from neuron_backend.errors import ShowcaseError
from neuron_backend.image.references import FIT_MODES
from neuron_backend.runtime import Backend
from ui.api import refusals_as_toast, user_errors
from ui.i18n import say, t
from ui.image_tab import ImageForm

from .png_settings import PastedSettings, read_settings

# Where a dropped PNG's settings came from, in words (the sources are its text chunks' names).
PNG_SOURCES = {"showcase": "this app's parameters", "infotext": "its A1111-style parameters text"}


def restored_text(pasted: PastedSettings) -> str:
    """The note under a dropped PNG: where its settings came from, and what was adjusted."""
    notes = "".join(say("; {note}", note=n) for n in pasted.notes)
    return say("Restored from the PNG ({source}): size {size}{notes}.",
               source=say(PNG_SOURCES.get(pasted.source, pasted.source)), size=pasted.size, notes=notes)


def build_drop_box(backend: Backend, form: ImageForm) -> gr.File:
    """The drop box and its note (call where the tab calls its extras), wired to ``form``; the box."""
    settings = backend.settings
    with gr.Accordion(t("Restore settings from a PNG"), open=False):
        dropped = gr.File(label=t("Drop a PNG (this app's or A1111-style) to fill the form"),
                          file_types=[".png"], type="filepath", elem_id="paste-png")
        paste_note = gr.Markdown(elem_id="paste-note")

    def pasted_fields(path):
        """The form values a PNG stores: prompt, size, steps, seed, randomize, guidance, the note (skip: kept)."""
        if not path:
            return (gr.skip(),) * 7
        pasted = read_settings(path, settings)
        keep = gr.skip()
        return (pasted.prompt, pasted.size, keep if pasted.steps is None else pasted.steps,
                keep if pasted.seed is None else pasted.seed, pasted.seed is None,
                keep if pasted.guidance is None else pasted.guidance, restored_text(pasted))

    def pasted_values(path):
        """/paste_png: the same values, None where the PNG holds none (a client reads values, not the page's
        "keep this field" updates)."""
        return tuple(None if value == gr.skip() else value for value in pasted_fields(path))

    def pasted_fit(path):
        try:
            fit = read_settings(path, settings).fit if path else None
        except ShowcaseError:
            fit = None  # the paste-back event itself says why
        return fit if fit in FIT_MODES else gr.skip()

    # The page shows a refusal as one toast; /paste_png raises it as a Gradio error for API clients.
    pasted = [form.prompt, form.size, form.steps, form.seed, form.randomize, form.guidance, paste_note]
    dropped.upload(refusals_as_toast(outputs=7)(pasted_fields), dropped, pasted, api_visibility="private")
    with gr.Column(visible=False):
        paste_trigger = gr.Button()
    # Left off the "Use via API" page (docs/page.md, "The Image tab underneath"); scripts call it by name.
    paste_trigger.click(user_errors(pasted_values), dropped, pasted, api_name="paste_png",
                        api_visibility="undocumented")
    if form.fit is not None:  # a dropped PNG of an edit sets its fit mode
        dropped.upload(pasted_fit, dropped, form.fit, api_visibility="private", queue=False)
    return dropped
