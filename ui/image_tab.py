"""The Image tab: a prompt row, the picture with its live preview and progress, precompiled sizes only,
stop, several images per run, this session's gallery, the PNGs folded away; reference images to edit from
when the server declares editing (image_references.py); blocks plug-ins add under the settings (``extras``,
each wired to the form through ``ImageForm``).

A run is ``press_generate`` (progress and previews; its ``ImageRun`` kept in the session's state), then
``show_images``; Stop cancels the first (docs/page.md, "Stop").
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial

import gradio as gr
from gradio.context import Context
from PIL import Image

from neuron_backend.errors import CancelledError, ShowcaseError, whole_number
from neuron_backend.image.engine import DEFAULT_GUIDANCE, GUIDANCE_MAX, GUIDANCE_MIN, ImageRequest
from neuron_backend.messages import Message, tr
from neuron_backend.metrics import RequestClock, measured
from neuron_backend.runtime import Backend

from .api import ImageRun, drops_early_cancels, queued_at, refusals_as_toast, shown
from .guards import EarlyCancels
from .i18n import lang, localized, say, t
from .image_references import REFERENCES_CSS, build_reference_picker, references_of, wire_reference_picker
from .presentation import python_snippet, size_choice_label

SEED_MAX = 2**32 - 1
IMAGE_EXAMPLES = ["a golden retriever surfing a wave, photorealistic", "a lighthouse at dusk, watercolor"]
# The picture fills its box, scaled to fit: a small size (and each preview frame) is drawn large, not at 1:1.
# The gallery's frame fits its rows of thumbnails (Gradio keeps an empty "auto" gallery at least 320 px tall).
IMAGE_CSS = ("#image-out img { width: 100%; height: 100%; object-fit: contain; }\n"
             "#gallery .grid-wrap.fixed-height { min-height: 0; }\n"
             # Gradio's second progress line says the bar's again; kept while queued (docs/page.md)
             "#image-progress .wrap:has(.progress-level) .progress-text { display: none; }\n"
             # the progress line takes room only while a run is on (Generate marks it; the run's end unmarks it)
             "body:not(.image-running) #image-progress { display: none; }\n" + REFERENCES_CSS)
# Generate opens the progress line and brings the picture into view when it is not wholly in view (on a phone it
# is under the fold): from Generate down (Stop beside it) when that fits in the window, else from the progress
# line down.
SHOW_PICTURE_JS = """() => {
  document.body.classList.add('image-running');
  const picture = document.querySelector('#image-out'), button = document.querySelector('#generate');
  if (!picture) return;
  const r = picture.getBoundingClientRect();
  if (r.top >= 0 && r.bottom <= window.innerHeight) return;
  const fits = button && r.bottom - button.getBoundingClientRect().top <= window.innerHeight;
  const top = fits ? button : document.querySelector('#image-progress') || picture;
  top.scrollIntoView({block: 'start', behavior: 'smooth'});
}"""
PREVIEW_EVERY_S = 0.3  # the page gets a new preview frame at most this often


@dataclass
class ImageTab:
    """The components the status panel refreshes (size labels follow warm-up; guidance follows the model)."""

    size: gr.Dropdown
    guidance: gr.Slider
    steps: gr.Slider  # set to the model's default on page load (50 for a non-distilled checkpoint)


@dataclass(frozen=True)
class ImageForm:
    """The form's controls an image extra may read or fill."""

    prompt: gr.Textbox
    size: gr.Dropdown
    steps: gr.Slider
    seed: gr.Number
    randomize: gr.Checkbox
    guidance: gr.Slider
    fit: gr.Radio | None  # the references' fit mode; None when the server does not edit


ImageExtra = Callable[[Backend, ImageForm], object]  # (backend, the form) -> its block under the settings


def size_choices(backend: Backend) -> list[tuple[str, str]]:
    """The size picker's (label, value) pairs: each precompiled size with its warm-up state."""
    states = backend.shape_states("image") if "image" in backend.placements else {}
    return [(size_choice_label(s, states.get(s.label)), s.label) for s in backend.settings.sizes]


def image_snippet(url: str, params: dict, run: list[dict] | None = None) -> str:
    """The gradio_client call for an image, or for a whole several-image run (``run``: the params of the
    images it made; the call asks for all of them, ``images=N`` from the first seed). A stopped image or
    run says plainly that the call makes the finished one(s). Code: English in either page language."""
    images = params.get("run_images", 1) if run else 1
    code = python_snippet(url, params, images)
    stopped = next((p for p in run or [params] if p.get("stopped")), None)
    if images > 1 and (stopped or len(run) < images):
        last = f", the last after {stopped.get('steps_done')} of {stopped.get('steps')} steps" if stopped else ""
        code = (f"# This run was stopped: {len(run)} of {images} images were made{last}.\n"
                f"# The call below makes all {images} images, each with every step: the finished run,\n"
                "# not the stopped one shown.\n") + code
    elif stopped:
        code = (f"# This image was stopped after {params.get('steps_done')} of {params.get('steps')} steps.\n"
                f"# The call below runs all {params.get('steps')} steps: it makes the finished image, not the\n"
                "# stopped one shown (a stopped image cannot be reproduced by asking for fewer steps).\n") + code
    return code


def image_label(params: dict):
    """The picture's label: "Image", or where a stopped image stopped (the gallery's caption says it too)."""
    if params.get("stopped"):
        return say("Image · stopped after {done} of {steps} steps", done=params.get("steps_done"),
                   steps=params.get("steps"))
    return t("Image")


def caption(params: dict) -> str:
    """A gallery caption: seed and size (and where it stopped), in the page's language."""
    stopped = ""
    if params.get("stopped"):
        stopped = say(" · stopped {done}/{steps}", done=params.get("steps_done"), steps=params.get("steps"))
    return say("seed {seed} · {size}", seed=params["seed"], size=params["size"]) + stopped


def params_view(params: dict) -> dict:
    """An image's parameters as the JSON view shows them: the notes (``guidance_note``, ``save_note``) in the
    page's language; keys and every other value (the model's name too) stay as the API returns them."""
    return {k: localized(v) if k.endswith("_note") and isinstance(v, Message) else v for k, v in params.items()}


def progress_text(step: int, total: int, elapsed: float) -> str:
    """The progress bar's text: "step 3/8 · ~1.2 s left" (ETA from the mean step time so far)."""
    eta = elapsed / max(step, 1) * (total - step)
    return say("step {step}/{total} · ~{eta} s left", step=step, total=total, eta=f"{eta:.1f}")


def preview_label(frame) -> str:
    """The image's label while a preview frame shows: "Preview · image 1 · step 3/8"."""
    return say("Preview · image {index} · step {step}/{total}",
               index=frame.index + 1, step=frame.step, total=frame.total)


def preview_picture(frame) -> Image.Image:
    """A preview frame scaled up to the image's size, so the picture does not jump when the final one arrives."""
    return frame.image().resize((frame.width, frame.height), Image.BILINEAR)


def build_image_tab(backend: Backend, concurrency: dict[str, str], cancels: EarlyCancels,
                    extras: Sequence[ImageExtra] = ()) -> ImageTab:
    """Components and events of the Image tab (call inside a gr.Tab). ``cancels``: as for the public API; each of
    ``extras`` adds its block under the settings, before the examples."""
    settings = backend.settings
    last_seed = gr.State(None)
    session_images = gr.State([])  # this session's images: [{"path", "params"}], oldest first
    running = gr.State(None)  # the session's ImageRun, from press_generate's first update until shown
    # One prompt row with Generate (and Stop while a run is on), the picture large under it with its
    # progress line above it, the settings beside it, the files folded away until wanted.
    with gr.Row():
        prompt = gr.Textbox(label=t("Prompt"), lines=2, elem_id="image-prompt", scale=5,
                            max_length=settings.max_prompt_chars)
        with gr.Column(scale=1, min_width=160):
            generate_btn = gr.Button(t("Generate"), variant="primary", elem_id="generate")
            stop_btn = gr.Button(t("Stop"), variant="stop", elem_id="stop-image", visible=False)
    with gr.Row():
        with gr.Column(scale=3):
            # The run's progress bar: over the image box it would hide the preview (docs/page.md).
            image_progress = gr.Markdown(elem_id="image-progress", container=False, min_height=52)
            image_out = gr.Image(label=t("Image"), type="filepath", format="png", elem_id="image-out", height=440)
            use_result = gr.Button(t("Use this image as a reference"), size="sm", elem_id="use-as-reference",
                                   visible=False)  # with editing declared, shown once there is an image
            with gr.Accordion(t("PNG, parameters and Python"), open=False, elem_id="image-files"):
                # an output: no upload zone, no remove buttons
                png_file = gr.File(label=t("PNG with embedded parameters"), elem_id="png-file",
                                   file_count="multiple", interactive=False)
                params_out = gr.JSON(label=t("Parameters"), elem_id="image-params")
                # No line numbers: Gradio's gutter drifts from the lines (docs/page.md).
                snippet = gr.Code(label=t("Use from Python"), language="python", elem_id="python-snippet",
                                  show_line_numbers=False)
        with gr.Column(scale=2):
            size = gr.Dropdown(choices=size_choices(backend), value=settings.sizes[0].label,
                               label=t("Size (precompiled only)"), elem_id="image-size")
            # The model's own default (50 for a non-distilled checkpoint already on disk), read before it loads.
            steps = gr.Slider(1, settings.max_steps, value=backend.image_default_steps(), step=1, label=t("Steps"),
                              elem_id="image-steps")
            # Hidden at --max-images-per-run 1; Gradio refuses a slider whose minimum is its maximum.
            count = gr.Slider(1, max(settings.max_images_per_run, 2), value=1, step=1, label=t("Images per run"),
                              info=t("consecutive seeds, made one after another"), elem_id="image-count",
                              visible=settings.max_images_per_run > 1)
            with gr.Row():
                seed = gr.Number(label=t("Seed"), value=0, precision=0, minimum=0, maximum=SEED_MAX,
                                 elem_id="image-seed")
                randomize = gr.Checkbox(label=t("Randomize seed"), value=True, elem_id="image-randomize")
                reuse = gr.Button(t("Reuse last seed"), size="sm")
            guidance = gr.Slider(GUIDANCE_MIN, GUIDANCE_MAX, value=DEFAULT_GUIDANCE, step=0.5,
                                 label=t("Guidance"), visible=not backend.image_distilled(),
                                 elem_id="image-guidance")
            live = gr.Checkbox(label=t("Live preview"), value=settings.image_preview,
                               elem_id="image-live-preview", interactive=settings.image_preview,
                               info=None if settings.image_preview else t("off on this server (--no-image-preview)"))
            picker = build_reference_picker(settings)  # None unless --references declares editing
            form = ImageForm(prompt, size, steps, seed, randomize, guidance, picker.fit if picker else None)
            for extra in extras:
                extra(backend, form)
            examples = gr.Examples(IMAGE_EXAMPLES, inputs=prompt, label=t("Examples"))
            # in the page's language (what a click puts in the prompt): built in English, set per visitor on load
            gr.on([Context.root_block.load], lambda: gr.skip() if lang() == "en" else gr.Dataset(
                samples=[[say(e)] for e in IMAGE_EXAMPLES]), None, examples.dataset, queue=False,
                  api_visibility="private", show_progress="hidden")
    # Whole thumbnails in fixed columns: fit_columns hid the captions of one or two images (docs/page.md).
    gallery = gr.Gallery(label=t("This session's images (click one for its PNG and parameters)"), columns=5,
                         fit_columns=False, height="auto", object_fit="contain", show_label=True, elem_id="gallery",
                         visible=False)  # shown once the session has an image

    def base_url(request: gr.Request) -> str:
        return str(request.request.base_url) if request and request.request else "http://127.0.0.1:7860/"

    @refusals_as_toast(outputs=8)
    @measured(backend.metrics, "image_tab", queued_at, ends=False)  # show_images ends the request
    @partial(drops_early_cancels, cancels)
    async def press_generate(text, size_label, n_steps, n_images, seed_value, randomize_seed, guidance_value,
                             want_preview, reference_files=None, fit=None, progress=gr.Progress()):
        # The Seed box sends None when empty, or when it holds more digits than a browser number keeps.
        chosen = random.randint(0, SEED_MAX) if randomize_seed else whole_number(tr("Seed"), seed_value, 0, SEED_MAX)
        run = ImageRun(backend, ImageRequest(prompt=text, size=size_label, steps=int(n_steps), seed=chosen,
                                             guidance=None if backend.image_distilled() else guidance_value,
                                             count=int(n_images or 1),
                                             references=references_of(reference_files, fit, settings)),
                       preview=bool(want_preview) and settings.image_preview)
        def report(state) -> None:
            if state is None:
                progress(0.0, desc=say("starting (or waiting for the image engine)"))
            else:
                progress(state[:2], desc=progress_text(*state), unit=say("steps"))

        # Each output hides Gradio's progress bar until the next progress message (docs/page.md): yield only
        # what changes the page, and report progress again right after each yield.
        first = True
        async with aclosing(run.updates(frame_every=PREVIEW_EVERY_S, at_once=True)) as updates:
            async for state, frame in updates:
                report(state)
                if frame is None and not first:
                    continue
                first = False
                shows = gr.skip() if frame is None else gr.update(value=preview_picture(frame),
                                                                  label=preview_label(frame))
                yield (shows,) + (gr.skip(),) * 6 + (run,)
                report(state)

    async def show_images(run, past, request: gr.Request):
        """What the run made (stopped: so far), or its refusal as a toast; the session has no run after it."""
        # The run's request ends here: its clock started when press_generate joined the queue.
        clock = None if run is None else RequestClock(backend.metrics, "image_tab", since=run.queued_at, waited=False)
        try:
            if run is None:  # Stop took the request out of the queue before its turn
                raise CancelledError(tr("Stopped before it started: no step ran and nothing was saved."))
            made = [{"path": path, "params": dict(params, wall_s=round(time.perf_counter() - run.started, 3))}
                    for path, params in await run.finished()]
        except ShowcaseError as exc:
            if clock is not None:
                clock.refused(exc)
            gr.Warning(shown(exc))
            return (gr.skip(),) * 7 + (None,)
        finally:
            if clock is not None:
                clock.finish()
        items, first = [*past, *made], made[0]["params"]
        shown_params = params_view(first) if len(made) == 1 else [params_view(m["params"]) for m in made]
        return (gr.update(value=made[0]["path"], label=image_label(first)), [m["path"] for m in made], shown_params,
                image_snippet(base_url(request), first, [m["params"] for m in made]), first["seed"], items,
                gr.update(value=gallery_value(items), visible=True), None)

    def pick_image(items, evt: gr.SelectData, request: gr.Request):
        if not items or evt.index is None or not 0 <= evt.index < len(items):
            return (gr.skip(),) * 4
        item = items[evt.index]
        return (gr.update(value=item["path"], label=image_label(item["params"])), [item["path"]],
                params_view(item["params"]),
                image_snippet(base_url(request), item["params"]))

    outputs = [image_out, png_file, params_out, snippet, last_seed, session_images, gallery, running]
    # Stop is there while a run is on (queued included: Stop takes it out of Gradio's queue); registered
    # before the run's event, so the page shows it before it sends the run.
    generate_btn.click(lambda: gr.update(visible=True), None, stop_btn, queue=False, api_visibility="private")
    generate_btn.click(None, None, None, js=SHOW_PICTURE_JS, queue=False, api_visibility="private")
    editing = [picker.files, picker.fit] if picker else []
    generating = generate_btn.click(
        press_generate, [prompt, size, steps, count, seed, randomize, guidance, live, *editing], outputs,
        concurrency_limit=backend.image_slots(), concurrency_id=concurrency.get("image"), api_visibility="private",
        show_progress_on=[image_progress])
    # .then runs after a cancel too; no concurrency limit: it waits for no other user's image.
    shown_run = generating.then(show_images, [running, session_images], outputs, concurrency_limit=None,
                                api_visibility="private", show_progress_on=[image_progress])
    shown_run.then(lambda: gr.update(visible=False), None, stop_btn, queue=False, api_visibility="private")
    shown_run.then(None, None, None, js="() => { document.body.classList.remove('image-running'); }",
                   queue=False, api_visibility="private")
    # Stop ends press_generate (its close reaches ImageRun's finally through every wrapper); stop() also
    # stops the image itself, the moment the click arrives.
    stop_btn.click(lambda run: run and run.stop(), running, None, cancels=[generating], queue=False,
                   api_visibility="private")
    gallery.select(pick_image, session_images, [image_out, png_file, params_out, snippet],
                   api_visibility="private")
    reuse.click(lambda s: (s if s is not None else gr.skip(), False), last_seed, [seed, randomize],
                api_visibility="private")
    if picker:
        wire_reference_picker(picker, settings, size, use_result, png_file)
    return ImageTab(size=size, guidance=guidance, steps=steps)


def gallery_value(items: list[dict]) -> list[tuple[str, str]]:
    """The gallery's (file, caption) pairs: whole thumbnails, each captioned with its seed and size."""
    return [(item["path"], caption(item["params"])) for item in items]
