"""The Image tab: precompiled sizes only, progress with ETA, stop, this session's gallery, the PNG."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import gradio as gr

from neuron_backend.image.engine import DEFAULT_GUIDANCE, GUIDANCE_MAX, GUIDANCE_MIN, ImageRequest
from neuron_backend.runtime import Backend

from .api import follow, user_errors
from .presentation import python_snippet, size_choice_label

SEED_MAX = 2**32 - 1
IMAGE_EXAMPLES = ["a golden retriever surfing a wave, photorealistic", "a lighthouse at dusk, watercolor"]


@dataclass
class ImageTab:
    """The components the status panel refreshes (size labels follow warm-up; guidance follows the model)."""

    size: gr.Dropdown
    guidance: gr.Slider


def size_choices(backend: Backend) -> list[tuple[str, str]]:
    """The size picker's (label, value) pairs: each precompiled size with its warm-up state."""
    states = backend.shape_states("image") if "image" in backend.placements else {}
    return [(size_choice_label(s, states.get(s.label)), s.label) for s in backend.settings.sizes]


def build_image_tab(backend: Backend, concurrency: dict[str, str]) -> ImageTab:
    """Components and events of the Image tab (call inside a gr.Tab)."""
    settings = backend.settings
    last_seed = gr.State(None)
    session_gallery = gr.State([])
    with gr.Row():
        with gr.Column(scale=2):
            prompt = gr.Textbox(label="Prompt", lines=2, elem_id="image-prompt",
                                max_length=settings.max_prompt_chars)
            size = gr.Dropdown(choices=size_choices(backend), value=settings.sizes[0].label,
                               label="Size (precompiled only)", elem_id="image-size")
            steps = gr.Slider(1, settings.max_steps, value=settings.default_steps, step=1, label="Steps")
            with gr.Row():
                seed = gr.Number(label="Seed", value=0, precision=0, minimum=0, maximum=SEED_MAX)
                randomize = gr.Checkbox(label="Randomize seed", value=True)
                reuse = gr.Button("Reuse last seed", size="sm")
            guidance = gr.Slider(GUIDANCE_MIN, GUIDANCE_MAX, value=DEFAULT_GUIDANCE, step=0.5, label="Guidance",
                                 visible=not backend.image_distilled())
            with gr.Row():
                generate_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-image")
            gr.Examples(IMAGE_EXAMPLES, inputs=prompt)
        with gr.Column(scale=3):
            image_out = gr.Image(label="Image", type="filepath", format="png", elem_id="image-out")
            png_file = gr.File(label="PNG with embedded parameters", elem_id="png-file")
            params_out = gr.JSON(label="Parameters", elem_id="image-params")
            snippet = gr.Code(label="Use from Python", language="python", elem_id="python-snippet")
    gallery = gr.Gallery(label="This session's images", columns=6, height=220, object_fit="contain",
                         elem_id="gallery")

    active_calls: dict[str, object] = {}  # session -> its running ImageCall, for Stop

    @user_errors
    def press_generate(text, size_label, n_steps, seed_value, randomize_seed, guidance_value, past,
                       request: gr.Request, progress=gr.Progress()):
        chosen = random.randint(0, SEED_MAX) if randomize_seed else seed_value
        started = time.perf_counter()
        call = backend.start_image(
            ImageRequest(prompt=text, size=size_label, steps=int(n_steps), seed=int(chosen),
                         guidance=None if backend.image_distilled() else guidance_value))
        session = getattr(request, "session_hash", None) or "anonymous"
        active_calls[session] = call
        try:
            for state in follow(call):
                if state is None:
                    progress(0.0, desc="starting (or waiting for the image engine)")
                else:
                    step, total, elapsed = state
                    eta = elapsed / max(step, 1) * (total - step)
                    progress((step, total), desc=f"step {step}/{total} · ~{eta:.1f} s left", unit="steps")
                yield (gr.skip(),) * 7
        finally:
            active_calls.pop(session, None)
        result = call.result()
        params = dict(result.params, wall_s=round(time.perf_counter() - started, 3))
        path = str(result.path) if result.path else str(backend.exports.write_png(result.image))
        gallery_items = [*past, (path, f"seed {result.seed} · {params['size']}")]
        url = str(request.request.base_url) if request and request.request else "http://127.0.0.1:7860/"
        yield (path, path, params, python_snippet(url, params), result.seed, gallery_items, gallery_items)

    def press_stop(request: gr.Request):
        call = active_calls.get(getattr(request, "session_hash", None) or "anonymous")
        if call is not None:
            call.cancel()

    generate_btn.click(
        press_generate, [prompt, size, steps, seed, randomize, guidance, session_gallery],
        [image_out, png_file, params_out, snippet, last_seed, session_gallery, gallery],
        concurrency_limit=1, concurrency_id=concurrency.get("image"), api_visibility="private",
    )
    stop_btn.click(press_stop, None, None, queue=False, api_visibility="private")
    reuse.click(lambda s: (s if s is not None else gr.skip(), False), last_seed, [seed, randomize],
                api_visibility="private")
    return ImageTab(size=size, guidance=guidance)
