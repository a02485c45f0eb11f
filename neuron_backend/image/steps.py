"""One pipeline call of the image engine: the denoising loop's step callback, stop and preview frames.

The step callback (``callback_on_step_end``) runs on the engine's thread at every step boundary: it reports
progress, ends the loop once the request's cancel event is set (``pipe._interrupt``: the latents so far are
still decoded), and hands over host copies of the latents for preview frames (docs/page.md, "How the live
preview is drawn").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from PIL import Image

from ..devices import CompileCounter, synchronize
from .preview import LatentRGB

MAX_SEQUENCE_LENGTH = 512  # tokens the pipeline pads/truncates every prompt to (its default)
PREVIEW_INTERVAL_S = 0.2  # shortest time between two preview frames: short steps are previewed every k steps
ProgressFn = Callable[[int, int, float], None]


@dataclass
class PreviewFrame:
    """Host latents of one step and how to draw them; ``image()`` renders once, on first use (thread-safe)."""

    step: int
    total: int
    latents: torch.Tensor  # [1, seq, 4C] on the CPU
    table: LatentRGB
    width: int
    height: int
    index: int = 0  # which image of a several-image run
    _image: Image.Image | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def image(self) -> Image.Image:
        """The preview at 1/scale of the image's size (one pixel per latent pixel; 1/8 with FLUX.2's VAE)."""
        with self._lock:
            if self._image is None:
                self._image = self.table.render(self.latents, self.width, self.height)
            return self._image


PreviewFn = Callable[[PreviewFrame], None]


@dataclass
class Run:
    """What one pipeline call made."""

    image: Image.Image
    steps_done: int
    stopped: bool
    seconds: float
    graphs: int
    previews: int = 0  # preview frames handed out


def run_pipeline(pipe, request, seed: int, cancelled: threading.Event, placement,
                 progress: ProgressFn | None = None, preview: PreviewFn | None = None,
                 table: LatentRGB | None = None, agree_stop: Callable[[bool], bool] | None = None,
                 index: int = 0) -> Run:
    """Call the pipeline once for a validated request; the caller holds the engine's job lock."""
    total = request.steps
    start = time.perf_counter()
    state = {"done": 0, "stopped": False, "previews": 0, "last_preview": float("-inf")}
    want_preview = preview is not None and table is not None

    def on_step_end(pipeline, step: int, timestep, tensors: dict) -> dict:
        state["done"] = step + 1
        now = time.perf_counter()
        if progress is not None:
            progress(step + 1, total, now - start)
        stop = cancelled.is_set()
        if agree_stop is not None:  # tensor parallel: a broadcast every step, all ranks stop at rank 0's step
            stop = agree_stop(stop)
        if stop and step + 1 < total:
            pipeline._interrupt = True  # the pipeline skips the remaining steps, then decodes
            state["stopped"] = True
        elif want_preview and step + 1 < total and now - state["last_preview"] >= PREVIEW_INTERVAL_S:
            host = tensors["latents"][:1].detach().to("cpu", copy=True)  # no device op beyond the copy
            state["last_preview"], state["previews"] = now, state["previews"] + 1
            preview(PreviewFrame(step + 1, total, host, table, request.size.width, request.size.height, index))
        return tensors

    # The noise is drawn on a CPU generator on every device. On Neuron a device-side random op
    # would be one more thing to compile, and its generator need not match any other device's;
    # on the CPU a seed gives the same starting noise on neuron, cuda and cpu alike.
    # diffusers' randn_tensor draws on the generator's device and moves the noise to the model.
    generator = torch.Generator(device="cpu").manual_seed(seed)
    # An edit's references are already fitted to a size the pipeline keeps unchanged (references.py).
    edit = {"image": [reference.image for reference in request.references]} if request.references else {}
    graphs_before = CompileCounter.graphs()
    output = pipe(
        **edit,
        prompt=request.prompt,
        height=request.size.height,
        width=request.size.width,
        num_inference_steps=total,
        # 1.0 disables classifier-free guidance (and the pipeline's warning on distilled models).
        guidance_scale=1.0 if request.guidance is None else request.guidance,
        generator=generator,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        callback_on_step_end=on_step_end,
        output_type="pil",
    )
    synchronize(placement)
    seconds = time.perf_counter() - start
    return Run(output.images[0], state["done"], state["stopped"], seconds, CompileCounter.graphs() - graphs_before,
               state["previews"])


def prompt_tokens(pipe, prompt: str) -> int:
    """Tokens the text encoder would see, counted exactly as the pipeline builds its input."""
    messages = [{"role": "user", "content": prompt}]
    text = pipe.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    return len(pipe.tokenizer(text, verbose=False)["input_ids"])
