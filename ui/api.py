"""The public, scriptable endpoints (``/chat``, ``/generate_image``, ``/status``) and the error boundary.

``/edit_image`` is ``/generate_image`` with reference images (files) to edit from.

``user_errors`` is the one place where a backend error a user can fix (``ShowcaseError``) becomes a
``gr.Error``: shown as a toast in the page, returned as the error of an API call.
"""

from __future__ import annotations

import asyncio
import base64
import html
import inspect
import io
import logging
import time
from contextlib import aclosing, contextmanager
from functools import partial, wraps
from typing import Any, TypedDict, get_type_hints

import gradio as gr
from gradio.components.api_component import Api
from gradio.context import LocalContext
from gradio.processing_utils import save_bytes_to_cache
from gradio.utils import get_upload_folder
from gradio_client import handle_file

from neuron_backend.chat.text import ChatRequest, reply_notices  # not chat.engine: it imports transformers
from neuron_backend.errors import CancelledError, ShowcaseError, StorageError, storage_reason
from neuron_backend.image.engine import ImageRequest
from neuron_backend.image.png_info import png_bytes
from neuron_backend.image.references import (
    FIT_MODES,
    check_reference_count,
    read_reference,
    reference_fits,
    reference_pixel_limit,
)
from neuron_backend.messages import tr
from neuron_backend.metrics import held_over, measured
from neuron_backend.runtime import Backend

from .guards import EarlyCancels
from .i18n import localized
from .presentation import visitor_status

log = logging.getLogger("showcase.api")

SEED_MAX = 2**32 - 1
# Only the API client that cancelled could read it (and it has gone): English, like the API's other text.
EARLY_CANCEL = "Cancelled before it started: nothing ran and nothing was saved."


def queued_at() -> float:
    """When the running event joined Gradio's queue (``time.monotonic()``); now when it was not queued (a test, an
    unqueued event): the start of a web request's clock (``neuron_backend.metrics.measured``).

    Gradio 6.31 keeps each waiting or running event in ``blocks._queue.event_ids_to_events`` with its
    ``enqueue_time`` (``time.monotonic()`` at ``POST /gradio_api/queue/join``) and sets ``LocalContext.event_id``
    and ``LocalContext.blocks`` around every call of a handler.
    """
    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    events = getattr(getattr(blocks, "_queue", None), "event_ids_to_events", None)
    event = events.get(event_id) if isinstance(events, dict) and event_id else None
    joined = getattr(event, "enqueue_time", None)
    return joined if isinstance(joined, float) else time.monotonic()


def shown(exc: Exception) -> str:
    """An error's message as toast text, in the page's language (ui/i18n.py; API clients read English).

    Gradio renders toasts as HTML, and messages may echo user input: the text is escaped.
    """
    return html.escape(localized(exc), quote=False)


def _on_refusal(fn, refuse):
    """``fn`` (plain, generator or async generator) with a ShowcaseError handed to ``refuse(exc)``.

    ``refuse`` raises, or returns the handler's last result (a generator yields it).
    """
    if inspect.isgeneratorfunction(fn):

        @wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except ShowcaseError as exc:
                yield refuse(exc)

        return gen_wrapper

    if inspect.isasyncgenfunction(fn):

        @wraps(fn)
        async def async_gen_wrapper(*args, **kwargs):
            try:
                async with aclosing(fn(*args, **kwargs)) as inner:
                    async for item in inner:
                        yield item
            except ShowcaseError as exc:
                yield refuse(exc)

        return async_gen_wrapper

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ShowcaseError as exc:
            return refuse(exc)

    return wrapper


def _logged(exc: ShowcaseError) -> None:
    """One line in the server's log per refusal: a user's mistake, not the server's (no traceback)."""
    log.info("refused: %s: %s", type(exc).__name__, exc)


def _raise_gr_error(exc: ShowcaseError):
    _logged(exc)
    raise gr.Error(shown(exc), print_exception=False) from None  # Gradio prints a traceback otherwise


def user_errors(fn):
    """Turn backend errors a user can fix into gr.Error (shown in the UI, returned by the API)."""
    return _on_refusal(fn, _raise_gr_error)


def refusals_as_toast(outputs: int):
    """For page handlers: a backend refusal becomes one warning toast, and the outputs stay as they were.

    ``user_errors`` raises gr.Error, which also paints a red "Error" badge on every output of the
    event; in the page one clear message is enough. ``outputs`` is the event's number of outputs.
    """
    skip = gr.skip() if outputs == 1 else (gr.skip(),) * outputs

    def toast(exc: ShowcaseError):
        _logged(exc)
        gr.Warning(shown(exc))
        return skip

    return lambda fn: _on_refusal(fn, toast)


def drops_early_cancels(cancels: EarlyCancels, fn):
    """``fn`` (a generator or async generator handler) that ends at once, running nothing, when its job
    was cancelled before the client knew its event id (ui/guards.py ``EarlyCancels``)."""

    @contextmanager
    def refuse_early_cancel():
        if cancels.take(LocalContext.event_id.get(None)):  # set by Gradio around each handler call
            raise CancelledError(EARLY_CANCEL)
        yield

    return held_over(fn, refuse_early_cancel)


def _optional_int(value):
    return None if value in (None, "") else value


class ImageRun:
    """One image request as the Image tab and ``/generate_image`` both follow it: the call started, its
    progress and preview frames streamed, its PNGs written. However the handler ends (cancelled, closed, or its
    task gone), the image stops at its next step boundary. How each cancel reaches it: docs/page.md, "Stop"."""

    def __init__(self, backend: Backend, request: ImageRequest, preview: bool):
        self.queued_at = queued_at()  # when its event joined Gradio's queue (time.monotonic()): the tab's clock
        self.backend, self.call = backend, backend.start_image(request, preview=preview)
        self.started = time.perf_counter()

    async def updates(self, frame_every: float = 0.0, at_once: bool = False):
        """(progress, frame) every 0.1 s until the call ends (with ``at_once``, the first before any wait):
        progress is (step, total, elapsed_s) over the run, None while the request waits for the engine;
        frame a preview frame not yielded before, at most one per ``frame_every`` s, else None."""
        sent, sent_at = None, 0.0
        task = asyncio.current_task()  # the event's task: it iterates this handler from its first update to its last
        task.add_done_callback(self._on_task_end)
        try:
            while at_once or not self.call.wait(0):
                if not at_once:
                    await asyncio.sleep(0.1)
                at_once, frame = False, self.call.preview
                if frame is None or frame is sent or time.perf_counter() - sent_at < frame_every:
                    frame = None
                else:
                    sent, sent_at = frame, time.perf_counter()
                yield self.call.progress, frame
        finally:
            task.remove_done_callback(self._on_task_end)
            self.stop()

    def _on_task_end(self, task: asyncio.Task) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the image at its next step boundary, or drop it before its first step (once ended: nothing)."""
        if not self.call.wait(0):
            self.call.cancel()

    async def finished(self) -> list[tuple[str, dict]]:
        """Each image's PNG and parameters once the call has ended (stopped: those it made), or what it raised."""
        while not self.call.wait(0):
            await asyncio.sleep(0.05)
        return [(self.delivered(r), r.params) for r in self.call.results()]

    def delivered(self, result) -> str:
        """The file the page and API clients fetch ``result``'s PNG from: where it was saved, else a copy in
        the exports folder, else (a full or read-only cache root) one in Gradio's own cache, which Gradio
        always serves and empties after an hour: the image reaches its visitor whatever the cache root's disk.
        """
        if result.path is not None:
            return str(result.path)
        png = png_bytes(result.image, result.params)
        try:
            return str(self.backend.exports.write(png, ".png", "image"))
        except OSError:  # logged by the exports folder; the image's save_note says what to do
            pass
        try:
            return save_bytes_to_cache(png, "image.png", get_upload_folder())
        except OSError as exc:
            log.warning("could not hand out an image through Gradio's cache either: %s", exc)
            raise StorageError(tr("The image was made but could not be handed out: no folder of this server "
                                  "could be written ({reason}).", reason=storage_reason(exc))) from None


def preview_data_url(frame, max_side: int = 256) -> str:
    """A preview frame as a small PNG data URL (progress updates of API clients that ask for previews)."""
    image = frame.image()
    if max(image.size) > max_side:
        image = image.resize((image.width * max_side // max(image.size), image.height * max_side // max(image.size)))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class ChatReply(TypedDict):
    """One streamed /chat update (the last has ``done`` true and the reply's stats)."""

    reasoning: str
    answer: str
    delta: str
    done: bool
    dropped_turns: int
    stats: dict[str, Any] | None
    notices: list[str]  # final update: e.g. stopped at the token limit (still reasoning?), greedy with thinking


class WarmupStatus(TypedDict):
    """What /status returns: the warm-up snapshot plus what runs where."""

    tasks: list[dict[str, Any]]
    done: int
    total: int
    progress: float
    eta_s: float | None
    ready: bool
    started_at: float | None
    ready_at: float | None
    elapsed_s: float
    failed: list[str]
    cache_hits: int
    compiles_since_ready: int
    plan: dict[str, Any]  # graphs and eager programs per engine, the first-run ETA, the compile time limit
    banner: str
    demo: bool
    models: dict[str, str]
    models_reason: str
    device: dict[str, Any]
    cache_dir: str
    cache_problem: str | None
    cache_notes: list[str]
    engines: dict[str, dict[str, Any]]
    limits: dict[str, Any]


def _typed(fn):
    """Resolve ``fn``'s string annotations (this module has ``from __future__ import annotations``):
    Gradio reads a return hint as a type, and a string reads as "Any" on the API page."""
    inspect.unwrap(fn).__annotations__.update(get_type_hints(inspect.unwrap(fn)))
    return fn


def _nullable(schema: dict) -> dict:
    return {"oneOf": [{"type": "null"}, schema]}


def image_api_inputs(backend: Backend) -> list[Api]:
    """The /generate_image parameters as the API page and gradio_client show them: only ``prompt`` required."""
    settings = backend.settings
    sizes = [s.label for s in settings.sizes]
    return [
        Api(None, {"type": "string", "description": f"what to draw (at most {settings.max_prompt_chars} characters)"},
            "prompt"),
        Api(sizes[0], {"type": "string", "enum": sizes, "description": "one of the precompiled sizes"}, "size"),
        # The model's own default, as on the page (50 for a non-distilled checkpoint already on disk at start).
        Api(backend.image_default_steps(), {"type": "integer", "minimum": 1, "maximum": settings.max_steps,
                                     "description": f"denoising steps, 1 to {settings.max_steps}"}, "steps"),
        Api(None, _nullable({"type": "integer", "minimum": 0, "maximum": SEED_MAX,
                             "description": "None: a random seed (returned in the parameters)"}), "seed"),
        Api(None, _nullable({"type": "number", "description": "None: the model's default (ignored by "
                                                              "distilled models)"}), "guidance"),
        Api(1, {"type": "integer", "minimum": 1, "maximum": settings.max_images_per_run,
                "description": f"images with seeds seed, seed+1, ... (1 to {settings.max_images_per_run}); "
                               "above 1 the PNG and parameters outputs are lists"}, "images"),
        Api(False, {"type": "boolean", "description": "progress updates carry preview frames (PNG data URLs)"},
            "preview"),
    ]


class ReferenceFiles(gr.File):
    """/edit_image's reference files; the API page's example sends one picture (Gradio's own example image,
    as gr.Image's example does), not gr.File's PDF, so the example shows how a reference goes in."""

    is_template = True  # Gradio's mark for a preset of a component: the page and API page see a File
    EXAMPLE = "https://raw.githubusercontent.com/gradio-app/gradio/main/test/test_files/bus.png"

    def example_payload(self) -> Any:
        return [handle_file(self.EXAMPLE)]

    def example_value(self) -> Any:
        return [self.EXAMPLE]


def edit_api_inputs(backend: Backend) -> list:
    """The /edit_image parameters: /generate_image's, with the reference files and their fit mode after the prompt."""
    settings = backend.settings
    counts = ", ".join(str(n) for n in settings.references)
    generate = image_api_inputs(backend)
    return [
        generate[0],
        ReferenceFiles(file_count="multiple", label=f"references (allowed counts: {counts})"),
        Api("letterbox", {"type": "string", "description": f"fit mode: {' or '.join(FIT_MODES)} for every reference, "
                                                          "or one per reference, comma-separated"}, "fit"),
        *generate[1:],
    ]


def add_public_api(backend: Backend, concurrency: dict[str, str], cancels: EarlyCancels) -> None:
    """The scriptable endpoints (gradio_client): /chat, /generate_image, /status. Call inside the Blocks.

    ``cancels``: the jobs the guard (ui/guards.py) saw cancelled before their client knew their id.
    """

    # Gradio reads the return hint as the type of each streamed update (hence ChatReply, not Iterator).
    @user_errors
    @measured(backend.metrics, "/chat", queued_at)
    @partial(drops_early_cancels, cancels)
    def chat(message: str, history: list[dict[str, Any]] | None = None, system_prompt: str | None = None,
             thinking: bool = False, temperature: float | None = None, top_p: float | None = None,
             top_k: int | None = None, max_new_tokens: int | None = None, greedy: bool = False,
             seed: int | None = None) -> ChatReply:
        """Stream a reply: each update is {"reasoning", "answer", "delta", "done", "dropped_turns", "stats", "notices"}.

        "history" takes the Chat tab's messages or an exported conversation's "messages" as they are.
        """
        request = ChatRequest(message=message, history=history, system_prompt=system_prompt or None,
                              thinking=thinking, temperature=temperature, top_p=top_p, top_k=top_k,
                              max_new_tokens=max_new_tokens, greedy=greedy, seed=seed)
        for update in backend.stream_chat(request):
            yield {"reasoning": update.reasoning, "answer": update.answer, "delta": update.delta,
                   "done": update.done, "dropped_turns": update.dropped_turns,
                   "stats": None if update.stats is None else vars(update.stats),
                   "notices": [str(n) for n in reply_notices(update, request, backend.settings.max_new_tokens)]
                   if update.done else []}

    def status() -> WarmupStatus:
        """The warm-up status snapshot (JSON); without --auth, no server folder in it."""
        return visitor_status(backend)

    gr.api(_typed(chat), api_name="chat", concurrency_limit=backend.chat_slots(),
           concurrency_id=concurrency.get("chat"))
    gr.api(_typed(status), api_name="status", queue=False)

    with gr.Column(visible=False):
        api_inputs = image_api_inputs(backend)
        api_png = gr.File(label="png")
        api_params = Api(None, {"type": "object", "additionalProperties": {},
                                "description": "the image's parameters (prompt, size, steps, seed, ...)"},
                         "parameters")
        api_trigger = gr.Button()

    @user_errors
    @measured(backend.metrics, "/generate_image", queued_at)
    @partial(drops_early_cancels, cancels)
    async def generate_image_api(prompt: str, size: str | None = None, steps: int | None = None,
                                 seed: int | None = None, guidance: float | None = None, images: int = 1,
                                 preview: bool = False):
        """Generate "images" images (default 1); returns the PNG (parameters embedded) and its parameters,
        or, for several, the list of PNGs and the list of their parameters.

        With submit(), progress dicts {"status", "step", "total", "elapsed_s"} stream first (steps
        counted over the whole run); with "preview" true they also carry "preview" (a PNG data URL
        of the latest preview frame, 1/8 of the size) and "preview_step".
        """
        request = _api_request(prompt, size, steps, seed, guidance, images)
        async with aclosing(_image_updates(backend, request, preview is True)) as updates:
            async for update in updates:
                yield update

    api_trigger.click(generate_image_api, api_inputs,
                      [api_png, api_params], api_name="generate_image", concurrency_limit=backend.image_slots(),
                      concurrency_id=concurrency.get("image"))
    if max(backend.settings.references) > 0:  # /edit_image only where editing is declared (--references)
        add_edit_api(backend, concurrency, cancels)


def add_edit_api(backend: Backend, concurrency: dict[str, str], cancels: EarlyCancels) -> None:
    """/edit_image: /generate_image with reference files to edit from. Call inside the Blocks."""
    with gr.Column(visible=False):
        edit_inputs = edit_api_inputs(backend)
        edit_png = gr.File(label="png")
        edit_params = Api(None, {"type": "object", "additionalProperties": {},
                                 "description": "the image's parameters, each reference's sha256, sizes and fit "
                                                "among them"}, "parameters")
        edit_trigger = gr.Button()

    @user_errors
    @measured(backend.metrics, "/edit_image", queued_at)
    @partial(drops_early_cancels, cancels)
    async def edit_image_api(prompt: str, references: list[str] | None, fit: str | None = None,
                             size: str | None = None, steps: int | None = None, seed: int | None = None,
                             guidance: float | None = None, images: int = 1, preview: bool = False):
        """Edit from reference images (files): as /generate_image, with "references" (a count the server
        declares, see /status "limits") each fitted to the size's reference size by "fit" ("letterbox" or
        "crop": one for all, or comma-separated one per reference)."""
        files = [] if references in (None, "") else references if isinstance(references, list) else [references]
        check_reference_count(len(files), backend.settings.references)  # before any file is decoded
        fits = reference_fits(fit, len(files))
        limit = reference_pixel_limit(backend.settings.sizes)  # each file's header checked; decoded in the engine
        refs = tuple(read_reference(_file_path(f), mode, limit=limit) for f, mode in zip(files, fits, strict=True))
        request = _api_request(prompt, size, steps, seed, guidance, images, refs)
        async with aclosing(_image_updates(backend, request, preview is True)) as updates:
            async for update in updates:
                yield update

    edit_trigger.click(edit_image_api, edit_inputs, [edit_png, edit_params], api_name="edit_image",
                       concurrency_limit=backend.image_slots(), concurrency_id=concurrency.get("image"))


def _api_request(prompt, size, steps, seed, guidance, images, references=()) -> ImageRequest:
    """The request of a /generate_image or /edit_image call, as its arguments came ("images": default 1)."""
    return ImageRequest(prompt=prompt, size=size, steps=_optional_int(steps), seed=_optional_int(seed),
                        guidance=guidance, count=1 if images in (None, "") else images, references=references)


def _file_path(value) -> str:
    """The path of an uploaded file as Gradio hands it over (a path, or a FileData-like dict)."""
    return value.get("path", "") if isinstance(value, dict) else str(getattr(value, "path", value))


async def _image_updates(backend: Backend, request: ImageRequest, preview: bool):
    """The updates of one image call: progress dicts while it runs, then (PNG, parameters) or their lists.

    With submit(), progress dicts {"status", "step", "total", "elapsed_s"} stream first (steps counted
    over the whole run); with ``preview`` they also carry "preview" (a PNG data URL of the latest preview
    frame, 1/8 of the size) and "preview_step".
    """
    run = ImageRun(backend, request, preview=preview)
    async with aclosing(run.updates()) as updates:
        async for state, frame in updates:
            # Progress updates stream to clients that submit(); each one also lets the server
            # notice a client that went away (and then stop the image within a step).
            step, total, _ = state or (0, None, 0.0)
            update = {"status": "running" if state else "waiting", "step": step, "total": total,
                      "elapsed_s": round(time.perf_counter() - run.started, 2)}
            if frame is not None:
                update.update(preview=preview_data_url(frame), preview_step=frame.step,
                              preview_image=frame.index + 1)
            yield gr.skip(), update
    paths, params = zip(*await run.finished(), strict=True)
    yield (paths[0], params[0]) if request.count == 1 else (list(paths), list(params))
