"""The Image tab's reference images: upload, fit mode, order, and each reference shown as the model will see it.

Shown only when ``--references`` declares editing; the view is the engine's own ``fit_reference``, and the
files box holds the order: every change goes through its value. What it offers: docs/page.md, "Image".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from neuron_backend.errors import ShowcaseError
from neuron_backend.image.references import (
    DEFAULT_FIT,
    ReferenceFile,
    check_reference_count,
    fit_reference,
    read_reference,
    reference_pixel_limit,
)
from neuron_backend.settings import Settings
from neuron_backend.shapes import parse_size, reference_size

from .i18n import localized, say, t

# The view shows all of each fitted preview and its caption under it: the box grows with its rows (Gradio's
# fixed height cut the previews off), each preview keeps its aspect at a size that fits a column, and the
# caption wraps in its own line below the picture rather than covering its bottom edge (a letterbox's pad).
REFERENCES_CSS = """
#reference-view, #reference-view .grid-wrap { height: auto !important; min-height: 0; max-height: none;
  overflow: visible; }
#reference-view .grid-container { grid-template-columns: repeat(auto-fill, minmax(120px, 1fr)); grid-auto-rows: auto;
  padding-top: 28px; }
#reference-view .thumbnail-item { height: auto; aspect-ratio: auto; display: flex; flex-direction: column;
  border-radius: 0; }
#reference-view .thumbnail-item > img { width: 100%; height: auto; aspect-ratio: auto; max-height: 160px;
  border-radius: 0; }
#reference-view .thumbnail-item .caption-label { position: static; max-width: none; white-space: normal;
  border: none; border-top: 1px solid var(--border-color-primary); border-radius: 0; opacity: 1; }
"""


@dataclass
class ReferencePicker:
    """The components of the references box: files in, fit mode, the fitted view and its note."""

    box: gr.Accordion
    files: gr.File
    pasted: gr.Image  # an image pasted from the clipboard, moved into ``files`` at once
    fit: gr.Radio
    view: gr.Gallery
    note: gr.Markdown
    chosen: gr.Radio  # the index of the reference the buttons act on
    order: gr.Row  # the buttons' row, shown while there is a reference to move or remove
    earlier: gr.Button
    later: gr.Button
    remove: gr.Button


def build_reference_picker(settings: Settings) -> ReferencePicker | None:
    """The references box (call inside the tab's settings column); None when the server does not edit."""
    if max(settings.references) == 0:
        return None
    with gr.Accordion(t("Edit from reference images"), open=False, elem_id="image-references-box") as box:
        files = gr.File(label=t("Reference images (the prompt says what to change)"), file_count="multiple",
                        type="filepath", elem_id="image-references")
        # PNG, not Gradio's default WebP: the pasted pixels reach the model as they were copied.
        pasted = gr.Image(label=t("Paste a reference from the clipboard"), sources=["clipboard"], type="filepath",
                          format="png", height=120, elem_id="reference-paste")
        fit = gr.Radio([(t("letterbox (pad)"), "letterbox"), (t("crop"), "crop")], value=DEFAULT_FIT,
                       label=t("Fit to the image size"), elem_id="image-fit")
        note = gr.Markdown(elem_id="reference-note")
        view = gr.Gallery(label=t("As the model will see them"), columns=4, height="auto", object_fit="contain",
                          elem_id="reference-view", visible=False, allow_preview=False)
        chosen = gr.Radio([], label=t("Reference to move or remove"), elem_id="reference-chosen", visible=False)
        with gr.Row(visible=False) as order:
            earlier = gr.Button(t("Move earlier"), size="sm", elem_id="reference-earlier")
            later = gr.Button(t("Move later"), size="sm", elem_id="reference-later")
            remove = gr.Button(t("Remove"), size="sm", variant="stop", elem_id="reference-remove")
    return ReferencePicker(box, files, pasted, fit, view, note, chosen, order, earlier, later, remove)


def file_paths(files) -> list[str]:
    """The paths gr.File hands over (None, one path, or a list of them)."""
    if not files:
        return []
    return [str(f) for f in (files if isinstance(files, list) else [files])]


def references_of(files, fit: str | None, settings: Settings) -> tuple[ReferenceFile, ...]:
    """The request's references: their count checked against the served counts first, then each file's
    header read (its pixels within the limit; nothing decoded) with the one fit mode picked."""
    paths = file_paths(files)
    check_reference_count(len(paths), settings.references)
    limit = reference_pixel_limit(settings.sizes)
    return tuple(read_reference(path, fit or DEFAULT_FIT, limit=limit) for path in paths)


def fitted_view(settings: Settings, files, fit: str | None, size_label: str):
    """(gallery update, note): each reference fitted for ``size_label``, or why it cannot be sent."""
    paths = file_paths(files)
    if not paths:
        return gr.update(value=None, visible=False), ""
    allowed = ", ".join(str(n) for n in settings.references)
    if len(paths) not in settings.references:
        return gr.update(value=None, visible=False), say(
            "**{count} reference images cannot be sent:** this server edits with {allowed} (each count is "
            "compiled ahead of time). Remove some.", count=len(paths), allowed=allowed)
    try:
        target = reference_size(parse_size(size_label))
        limit = reference_pixel_limit(settings.sizes)
        fitted = [fit_reference(read_reference(path, fit or DEFAULT_FIT, limit=limit), target, limit)
                  for path in paths]
    except ShowcaseError as exc:
        return gr.update(value=None, visible=False), localized(exc)
    items = [(ref.image, say("{index} · {original} → {fitted} · {fit}", index=i + 1,
                             original=f"{ref.original[0]}x{ref.original[1]}", fitted=ref.fitted.label,
                             fit=say(ref.fit))) for i, ref in enumerate(fitted)]
    return gr.update(value=items, visible=True), say("The model sees each reference at {size} ({fit}).",
                                                     size=target.label, fit=say(fitted[0].fit))


def reference_choices(files, chosen):
    """The picker's radio: one "1 · name" choice per reference, the chosen one kept while it exists."""
    paths = file_paths(files)
    index = chosen if isinstance(chosen, int) and 0 <= chosen < len(paths) else None
    choices = [(f"{i + 1} · {Path(path).name}", i) for i, path in enumerate(paths)]
    return gr.update(choices=choices, value=index, visible=bool(paths))


def clicked(evt: gr.SelectData):
    """The reference clicked in the view becomes the chosen one."""
    return evt.index if isinstance(evt.index, int) else gr.skip()


def moved(files, chosen, step: int):
    """(files, chosen): the chosen reference moved ``step`` places (-1 earlier, 1 later), within the list."""
    paths = file_paths(files)
    if not isinstance(chosen, int) or not 0 <= chosen < len(paths):
        return gr.skip(), gr.skip()
    target = min(max(chosen + step, 0), len(paths) - 1)
    paths.insert(target, paths.pop(chosen))
    return paths, target


def removed(files, chosen):
    """(files, chosen): the list without the chosen reference; the one after it (or the new last) chosen."""
    paths = file_paths(files)
    if not isinstance(chosen, int) or not 0 <= chosen < len(paths):
        return gr.skip(), gr.skip()
    del paths[chosen]
    return (paths or None), (min(chosen, len(paths) - 1) if paths else None)


def with_pasted(files, pasted):
    """(files, pasted): the image pasted from the clipboard added as the last reference, the paste box emptied."""
    if not pasted:
        return gr.skip(), gr.skip()
    return [*file_paths(files), str(pasted)], None


def with_result(files, shown_pngs):
    """(files, box): the result image shown beside (the first of its PNGs) added as the last reference, the
    box opened on it; nothing shown yet: a message that says how to get one."""
    pngs = file_paths(shown_pngs)
    if not pngs:
        gr.Info(say("No image yet: generate one, or click one in this session's images."))
        return gr.skip(), gr.skip()
    return [*file_paths(files), pngs[0]], gr.update(open=True)


def wire_reference_picker(picker: ReferencePicker, settings: Settings, size: gr.Dropdown,
                          use_result: gr.Button | None = None, shown_pngs: gr.File | None = None) -> None:
    """The view and the choices follow the files, the fit mode and the size; the buttons reorder and remove;
    ``use_result`` adds the result ``shown_pngs`` holds."""
    view = [picker.view, picker.note]
    for trigger in (picker.files.change, picker.fit.change, size.change):
        trigger(lambda files, fit, label: fitted_view(settings, files, fit, label), [picker.files, picker.fit, size],
                view, api_visibility="private", queue=False)
    picker.files.change(reference_choices, [picker.files, picker.chosen], picker.chosen, api_visibility="private",
                        queue=False)
    picker.files.change(lambda files: gr.update(visible=bool(file_paths(files))), picker.files, picker.order,
                        api_visibility="private", queue=False)
    picker.view.select(clicked, None, picker.chosen, api_visibility="private", queue=False)
    listed = [picker.files, picker.chosen]
    picker.earlier.click(lambda files, chosen: moved(files, chosen, -1), listed, listed, api_visibility="private",
                         queue=False)
    picker.later.click(lambda files, chosen: moved(files, chosen, 1), listed, listed, api_visibility="private",
                       queue=False)
    picker.remove.click(removed, listed, listed, api_visibility="private", queue=False)
    picker.pasted.change(with_pasted, [picker.files, picker.pasted], [picker.files, picker.pasted],
                         api_visibility="private", queue=False)
    if use_result is not None and shown_pngs is not None:
        # shown under the picture once there is one to use (under an empty box it offered nothing)
        shown_pngs.change(lambda pngs: gr.update(visible=bool(file_paths(pngs))), shown_pngs, use_result,
                          api_visibility="private", queue=False)
        use_result.click(with_result, [picker.files, shown_pngs], [picker.files, picker.box],
                         api_visibility="private", queue=False)
