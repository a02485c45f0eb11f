"""The image engine: FLUX.2-klein through diffusers' Flux2KleinPipeline, at declared sizes only.

A request names one of ``settings.sizes`` (and a reference count of ``settings.references``) or is refused;
steps, seed and guidance never recompile. One request or warm-up runs at a time (``SerialJobs``), the others
wait in line; ``cancel()`` stops only the running one. The pipeline's quirks: docs/architecture.md, "The image engine".
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
from PIL import Image

from ..devices import CompileCounter, Placement, compile_or_eager, on_device, repeated_blocks, synchronize, uncompiled
from ..errors import CancelledError, EngineUnavailableError, InvalidRequestError, UnsupportedSizeError, whole_number
from ..messages import tr
from ..plugins import Sharding, wrap_compiled
from ..settings import Settings
from ..shapes import EditSlot, ImageSize, SerialJobs, ShapeRegistry, image_shape, parse_size, reference_size, shape_keys
from . import loading
from .inputs import GUIDANCE_MAX, GUIDANCE_MIN, clean_prompt, guidance_value
from .png_info import OutputFolder, read_png_parameters
from .preview import LatentRGB, PreviewFn, PreviewFrame, cached_or_fitted
from .references import (
    FIT_MODES,
    FittedReference,
    ReferenceFile,
    ReferenceImage,
    check_reference_count,
    check_reference_pixels,
    fit_mode,
    fit_reference,
    reference_pixel_limit,
)

__all__ = ["GUIDANCE_MAX", "GUIDANCE_MIN", "MAX_SEQUENCE_LENGTH", "ImageEngine", "ImageRequest", "ImageResult",
           "PreviewFrame", "ReferenceImage", "clean_prompt", "read_png_parameters"]

log = logging.getLogger("showcase.image")

SEED_MAX = 2**32 - 1  # seeds are 0 .. SEED_MAX
MAX_SEQUENCE_LENGTH = 512  # tokens the pipeline pads/truncates every prompt to (its default)
PREVIEW_INTERVAL_S = 0.2  # shortest time between two preview frames: short steps are previewed every k steps
ProgressFn = Callable[[int, int, float], None]
DEFAULT_GUIDANCE = 4.0  # Flux2KleinPipeline's default, for the non-distilled (base) models
SAMPLER = "FlowMatchEuler"
WARMUP_PROMPT = "a warm-up image"
WARMUP_REFERENCE_GREY = (128, 128, 128)  # the warm-up's references: plain grey, already at the reference size


@dataclass(frozen=True)
class ImageRequest:
    """One image request. ``steps``, ``guidance`` None: the default; ``seed`` None: random; ``count`` images
    with seeds seed, seed+1, ...; ``references``: images to edit from. Validated, images are ``FittedReference``s
    and a ``ReferenceFile`` stays undecoded (header checked) until the request holds the engine."""

    prompt: str
    size: str | ImageSize
    steps: int | None = None
    seed: int | None = None
    guidance: float | None = None
    count: int = 1
    references: tuple[ReferenceImage | ReferenceFile | FittedReference, ...] = ()


@dataclass
class ImageResult:
    """A generated image, where it was saved (None if it could not be) and everything that made it."""

    image: Image.Image
    path: Path | None
    params: dict
    seed: int
    stopped: bool
    prompt_truncated: bool
    seconds: float
    compiled_graphs: int  # graph compiles during this request: 0 once its size is warm


class ImageEngine:
    """Text-to-image and editing with a Flux2KleinPipeline on one device."""

    name = "image"

    def __init__(self, settings: Settings, placement: Placement, model_id: str, compiled: tuple = (),
                 sharding: Sharding | None = None):
        """``compiled``: the plug-ins' wrappers of the compiled transformer (``Parts.compiled``); ``sharding``: the
        keywords that load this rank's shard of the transformer where ``placement.tp`` is above 1."""
        self.settings = settings
        self.placement = placement
        self.model_id = model_id
        self.shapes = ShapeRegistry(self.name, shape_keys(settings, self.name))
        self.outputs = OutputFolder(Path(settings.cache_dir) / "outputs", settings.max_saved_images)
        self.load_seconds: float | None = None
        self.memory_note: str | None = None  # what loading needs and what was free (memory.py)
        self.default_steps = settings.default_steps  # 50 for a non-distilled checkpoint once loaded (loading.py)
        self.warmups: dict[str, dict] = {}  # size label -> {"seconds", "compiled_graphs"}; entries replaced whole
        self._wrappers, self._sharding = compiled, sharding
        self.saved_forwards = None  # the handle a wrapper returned for the compiled transformer (load); None: none
        self.jobs = SerialJobs()
        self._pipe = None
        self._distilled = False  # the loaded pipeline's is_distilled, read once at load
        self.preview_table: LatentRGB | None = None  # latents -> RGB for live previews (preview.py)
        # Tensor parallel only (--tp-engine image; Sharding.attach sets them on rank 0, the followers' loop on the
        # others): on_generate announces each pipeline call, agree_stop turns a stop into rank 0's every step.
        self.on_generate: Callable[[tuple], None] | None = None
        self.agree_stop: Callable[[bool], bool] | None = None
        self._versions: dict[str, str] = {"torch": torch.__version__}

    # -- lifecycle -------------------------------------------------------------------------

    def load(self, folder: Path) -> None:
        """Load the pipeline from a local folder onto the placement's device; compile if asked."""
        import diffusers  # imported here: it is slow to import and only this engine needs it
        import transformers

        start = time.perf_counter()
        # Every file checked, memory estimated (bfloat16 when float32 does not fit under --dtype auto; the
        # VAE's float32 decode only where it fits).
        self.placement, plan = loading.prepare(folder, self.model_id, self.placement, self.settings)
        self.memory_note = plan.note
        try:
            parts = {}
            if self.placement.tp > 1:  # this rank's shard of the transformer; the rest whole (Parts.sharding)
                parts["transformer"] = diffusers.Flux2Transformer2DModel.from_pretrained(
                    folder, subfolder="transformer", dtype=self.placement.dtype,
                    **self._sharding.load_kwargs(self.name, self.placement))
            with loading.quiet_upcast_warning():
                pipe = diffusers.Flux2KleinPipeline.from_pretrained(folder, dtype=self.placement.dtype, **parts)
            # Always an explicit device: accelerate cannot enumerate Neuron, so device_map="auto" loads on CPU.
            pipe.to(self.placement.device)
            loading.keep_force_upcast(pipe, folder, plan.upcast)
        except Exception as exc:  # noqa: BLE001 - any load failure makes the engine unavailable
            raise EngineUnavailableError(tr("Could not load the image model {model} from {folder}: {cause}",
                                            model=self.model_id, folder=str(folder),
                                             cause=loading.cause_chain(exc))) from exc
        loading.check_text_layers(pipe, self.model_id)  # else every image fails with a bare IndexError
        distilled = loading.is_distilled(pipe)
        self.default_steps = loading.default_steps(distilled, self.settings)
        pipe.set_progress_bar_config(disable=True)
        if self.placement.compile:
            # dynamic=False: one graph per declared size, reused for any steps, seed or prompt.
            options = {"backend": self.placement.compile_backend, "fullgraph": True, "dynamic": False}
            # Dynamo keeps at most recompile_limit (default 8) graphs per code object and each size
            # is one: make room for every declared size (process-wide, and only ever raised).
            wanted = len(self.shapes.keys()) + 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, wanted)
            if repeated_blocks(self.settings, self.placement):
                pipe.transformer.compile_repeated_blocks(**options)  # one graph per block class and size
            else:
                pipe.transformer.compile(**options)
            # Module.__call__ runs the transformer's _compiled_call_impl: a wrapper may replace it
            self.saved_forwards = wrap_compiled(self._wrappers, self.name, pipe.transformer, options, self.placement,
                                                self.settings)
        table = cached_or_fitted(folder, pipe.vae, self.settings.cache_dir) if self.settings.image_preview else None
        with self.jobs.job():  # never swap the pipeline under a running request
            self._pipe, self.preview_table, self._distilled = pipe, table, distilled
        self._versions = {
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
        }
        self.load_seconds = time.perf_counter() - start

    @property
    def loaded(self) -> bool:
        return self._pipe is not None

    @property
    def distilled(self) -> bool:
        """Whether the loaded model is step-distilled (no classifier-free guidance), as its config said when it
        loaded (loading.is_distilled)."""
        self._loaded_pipe()  # not loaded: EngineUnavailableError
        return self._distilled

    def warm_up(self, shape: ImageSize | EditSlot) -> None:
        """Run ``shape`` (a size, or an edit slot) once with 1 step so it compiles; mark it ready, or failed (that
        shape only) and re-raise. Its timing and graph count go to ``self.warmups[label]``."""
        pipe = self._loaded_pipe()
        size = self._served(shape.size if isinstance(shape, EditSlot) else shape)
        count = shape.references if isinstance(shape, EditSlot) else 0
        check_reference_count(count, self.settings.references)
        key = image_shape(size, count)
        grey = Image.new("RGB", tuple(reference_size(size)), WARMUP_REFERENCE_GREY)
        references = tuple(fit_reference(ReferenceImage(grey, sha256="warm-up"), reference_size(size))
                           for _ in range(count))
        request = ImageRequest(WARMUP_PROMPT, size, steps=1, seed=0, guidance=self._default_guidance(),
                               references=references)
        with self.jobs.job() as cancelled:
            try:  # on Neuron a shape that fails to compile runs again, eager (devices.compile_or_eager)
                run = compile_or_eager(self, key, self._run, pipe, request, 0, cancelled, None, None)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                self.shapes.mark_failed(key, reason)
                log.warning("image shape %s failed to warm up: %s", key.label, reason)
                raise
        self.shapes.mark_ready(key)
        self.warmups[key.label] = {"seconds": round(run.seconds, 3), "compiled_graphs": run.graphs}

    def cancel(self) -> bool:
        """Stop the running request after its current step; return whether one was running."""
        return self.jobs.cancel()

    @property
    def busy(self) -> bool:
        """Whether a request (or warm-up) is running now."""
        return self.jobs.busy

    # -- requests --------------------------------------------------------------------------

    def validate(self, request: ImageRequest) -> ImageRequest:
        """Check a request and return it normalised: clean prompt, ImageSize, steps and guidance filled in.

        Guidance is resolved only once the model is loaded (None for distilled models).
        Raises InvalidRequestError (UnsupportedSizeError for sizes) whose message says what is allowed.
        """
        if not isinstance(request, ImageRequest):
            raise InvalidRequestError(f"Expected an ImageRequest, got {type(request).__name__}.")
        prompt = clean_prompt(request.prompt, self.settings.max_prompt_chars)
        size = self._configured_size(request.size)
        steps = self.default_steps
        if request.steps is not None:
            steps = whole_number(tr("Steps"), request.steps, 1, self.settings.max_steps)
        seed = None if request.seed is None else whole_number(tr("Seed"), request.seed, 0, SEED_MAX)
        guidance = None if request.guidance is None else guidance_value(request.guidance)
        count = whole_number(tr("Images per run"), request.count, 1, self.settings.max_images_per_run)
        references = self._fitted_references(request.references, size)
        if self.loaded:
            guidance = None if self.distilled else DEFAULT_GUIDANCE if guidance is None else guidance
        return ImageRequest(prompt, size, steps, seed, guidance, count, references)

    def _fitted_references(self, references: object, size: ImageSize) -> tuple[FittedReference | ReferenceFile, ...]:
        """A request's references fitted to ``size``'s reference size; a count not served is refused.

        Files are only checked here (header pixels, fit mode): ``_decoded_references`` fits them later.
        """
        if not isinstance(references, (tuple, list)):
            raise InvalidRequestError(tr("References must be a list of images, not {kind}.",
                                         kind=type(references).__name__))
        check_reference_count(len(references), self.settings.references)
        target, limit = reference_size(size), self.reference_limit
        fitted = []
        for reference in references:
            if isinstance(reference, ReferenceFile):
                check_reference_pixels(reference, limit)
                fit_mode(reference.fit)
                fitted.append(reference)
            else:
                fitted.append(fit_reference(reference, target))
        return tuple(fitted)

    @property
    def reference_limit(self) -> int:
        """The most pixels a reference file may declare here (from the largest declared size)."""
        return reference_pixel_limit(self.settings.sizes)

    def _decoded_references(self, request: ImageRequest) -> ImageRequest:
        """``request`` with its reference files decoded and fitted, one at a time; the caller holds the job."""
        if not any(isinstance(reference, ReferenceFile) for reference in request.references):
            return request
        target = reference_size(request.size)
        fitted = tuple(fit_reference(reference, target, self.reference_limit) for reference in request.references)
        return replace(request, references=fitted)

    def shape_of(self, request: ImageRequest) -> ImageSize | EditSlot:
        """The shape key a validated request runs at: its size, or its size with its reference count."""
        return image_shape(request.size, len(request.references))

    def generate(self, request: ImageRequest, progress: ProgressFn | None = None,
                 cancel: threading.Event | None = None, preview: PreviewFn | None = None) -> ImageResult:
        """Make one image (``request.count`` must be 1); see ``generate_run``."""
        if getattr(request, "count", 1) != 1:
            raise InvalidRequestError(f"generate() makes one image; use generate_run() for {request.count}.")
        return self.generate_run(request, progress, cancel, preview)[0]

    def generate_run(self, request: ImageRequest, progress: ProgressFn | None = None,
                     cancel: threading.Event | None = None, preview: PreviewFn | None = None) -> list[ImageResult]:
        """Make ``request.count`` images, one after another in one job; blocks while another request runs.

        ``progress(step, steps x count, elapsed_s)`` runs on this thread per step; ``preview(frame)`` gets host
        latents of some steps. ``cancel`` stops this request at the next step and returns the images made; set
        before the first step: CancelledError, nothing run or saved. Raises InvalidRequestError,
        UnsupportedSizeError, ShapeNotReadyError, ShapeFailedError; EngineUnavailableError before load()."""
        pipe = self._loaded_pipe()
        normal = self.validate(request)
        self.shapes.require(self.shape_of(normal))
        first = secrets.randbelow(SEED_MAX + 1) if normal.seed is None else normal.seed
        seeds = [(first + i) % (SEED_MAX + 1) for i in range(normal.count)]
        table = self.preview_table if preview is not None and self.settings.image_preview else None
        if cancel is not None and cancel.is_set():
            raise CancelledError(tr("Stopped before it started: no step ran and nothing was saved."))
        runs = []
        with self.jobs.job(cancel) as cancelled:
            if cancelled.is_set():  # stopped while it waited for the engine
                raise CancelledError(tr("Stopped before it started: no step ran and nothing was saved."))
            self.shapes.require(self.shape_of(normal))  # its state may have changed while this request waited
            normal = self._decoded_references(normal)  # decoded only now that the request holds the engine
            tokens = prompt_tokens(pipe, normal.prompt)  # inside the job: tokenizers are not thread-safe
            for index, seed in enumerate(seeds):
                if index and cancelled.is_set():
                    break  # stopped: the remaining images are not started
                offset = index * normal.steps

                def image_progress(step, total, elapsed, offset=offset):
                    if progress is not None:
                        progress(offset + step, normal.steps * normal.count,
                                 sum(r.seconds for r in runs) + elapsed)

                runs.append(self._run(pipe, normal, seed, cancelled, image_progress, preview, table, index))
        return [self._result(request, normal, seed, tokens, run, index) for index, (seed, run)
                in enumerate(zip(seeds, runs, strict=False))]  # fewer runs when stopped

    def _result(self, request: ImageRequest, normal: ImageRequest, seed: int, tokens: int, run: Run,
                index: int) -> ImageResult:
        """Parameters of one image of a run, and its PNG saved."""
        params = self._params(request, normal, seed, tokens, run)
        if normal.count > 1:
            params.update(run_image=index + 1, run_images=normal.count)
        saved = self.outputs.save(run.image, params, stem=f"{normal.size.label}-s{seed}")
        if saved.problem:
            params["save_note"] = saved.problem  # only in the returned params: the PNG does not exist
        return ImageResult(
            image=run.image,
            path=saved.path,
            params=params,
            seed=seed,
            stopped=run.stopped,
            prompt_truncated=params["prompt_truncated"],
            seconds=run.seconds,
            compiled_graphs=run.graphs,
        )

    def describe(self) -> dict:
        """Plain data about the engine for the UI: model, placement, sizes and their state, limits."""
        distilled = self.distilled if self.loaded else None
        return {
            "name": self.name,
            "model": self.model_id,
            "loaded": self.loaded,
            "distilled": distilled,
            "placement": self.placement.label(),
            "device": self.placement.device,
            "dtype": self.placement.dtype_name,
            "mode": self._mode(),
            "sizes": [size.label for size in self.settings.sizes],
            "references": {"counts": list(self.settings.references), "fit_modes": list(FIT_MODES),
                           "sizes": {size.label: reference_size(size).label for size in self.settings.sizes}},
            "shapes": self.shapes.snapshot(),
            "steps": {"default": self.default_steps, "max": self.settings.max_steps},
            "memory": self.memory_note,
            "guidance": {
                "used": None if distilled is None else not distilled,
                "default": DEFAULT_GUIDANCE,
                "min": GUIDANCE_MIN,
                "max": GUIDANCE_MAX,
            },
            "max_prompt_chars": self.settings.max_prompt_chars,
            "max_sequence_length": MAX_SEQUENCE_LENGTH,
            "load_seconds": None if self.load_seconds is None else round(self.load_seconds, 3),
            "warmups": dict(self.warmups),  # copying a dict is atomic under the GIL
            "busy": self.jobs.busy,
            "outputs": {"folder": str(self.outputs.folder), "max_saved_images": self.outputs.limit},
            "versions": dict(self._versions),
        }

    # -- internals -------------------------------------------------------------------------

    def _loaded_pipe(self):
        pipe = self._pipe
        if pipe is None:
            raise EngineUnavailableError(tr("The image model is not loaded yet; wait for the warm-up to load it."))
        return pipe

    def _configured_size(self, value: object) -> ImageSize:
        """The size a request names ("WxH", a pair or an ImageSize), if it is one of ``settings.sizes``."""
        try:
            size = parse_size(value)
        except InvalidRequestError as exc:
            raise UnsupportedSizeError(tr("{error} Allowed sizes: {allowed}.", error=exc,
                                          allowed=self._allowed())) from None
        return self._served(size)

    def _served(self, size: ImageSize) -> ImageSize:
        """``size`` if it is one of ``settings.sizes``; else UnsupportedSizeError naming the allowed ones."""
        if size not in self.settings.sizes:
            raise UnsupportedSizeError(tr("Image size {size} is not served here (each size is compiled ahead of "
                                          "time). Allowed sizes: {allowed}.", size=size.label, allowed=self._allowed()))
        return ImageSize(*size)

    def _allowed(self) -> str:
        return ", ".join(size.label for size in self.settings.sizes)

    def _default_guidance(self) -> float | None:
        return None if self.distilled else DEFAULT_GUIDANCE

    def _mode(self) -> str:
        if not self.placement.compile:
            return "eager"
        blocks = ", repeated blocks" if repeated_blocks(self.settings, self.placement) else ""
        return f"compiled ({self.placement.compile_backend}{blocks})"

    def _run(self, pipe, request: ImageRequest, seed: int, cancelled: threading.Event, progress: ProgressFn | None,
             preview: PreviewFn | None, table: LatentRGB | None = None, index: int = 0, follower: bool = False) -> Run:
        """One pipeline call; the caller holds the job. ``request`` is validated and normalised."""
        if self.on_generate is not None and not follower:  # tensor parallel: followers run the same call
            self.on_generate((request, seed))
        eager = self.shape_of(request) in self.shapes.eager
        with on_device(self.placement), uncompiled(pipe.transformer, eager):
            return run_pipeline(pipe, request, seed, cancelled, self.placement, progress, preview, table,
                                agree_stop=self.agree_stop, index=index)

    def _params(self, request: ImageRequest, normal: ImageRequest, seed: int, tokens: int, run: Run) -> dict:
        """Everything needed to reproduce and explain the image; JSON-serialisable."""
        params = {
            "prompt": normal.prompt,
            "seed": seed,
            "steps": normal.steps,
            "steps_done": run.steps_done,
            "stopped": run.stopped,
            "size": normal.size.label,
            "width": normal.size.width,
            "height": normal.size.height,
            "guidance": normal.guidance,
            "distilled": self.distilled,
            "sampler": SAMPLER,
            "model": self.model_id,
            "device": self.placement.device,
            "dtype": self.placement.dtype_name,
            "mode": self._mode(),
            "compiled": self.placement.compile,
            "versions": dict(self._versions),
            "seconds": round(run.seconds, 3),
            "compiled_graphs": run.graphs,
            "prompt_tokens": tokens,
            "max_sequence_length": MAX_SEQUENCE_LENGTH,
            "prompt_truncated": tokens > MAX_SEQUENCE_LENGTH,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        if normal.references:  # an edit: what each reference was and how it was fitted (never its pixels)
            params["references"] = [reference.params() for reference in normal.references]
        if request.guidance is not None and normal.guidance is None:
            params["guidance_note"] = tr("guidance {value} ignored: {model} is step-distilled and runs without "
                                         "classifier-free guidance", value=request.guidance, model=self.model_id)
        return params


# ----- one pipeline call: the step callback (progress, stop, preview frames) -------------------------

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

    # A CPU generator on every device: a seed gives the same noise everywhere (docs/architecture.md).
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
