"""The public, scriptable endpoints (``/chat``, ``/generate_image``, ``/status``) and the error boundary.

``user_errors`` is the one place where a backend error a user can fix (``ShowcaseError``) becomes a
``gr.Error``: shown as a toast in the page, returned as the error of an API call.
"""

from __future__ import annotations

import inspect
import tempfile
import time
from collections.abc import Iterator
from functools import wraps

import gradio as gr

from neuron_backend.chat.text import ChatRequest  # not chat.engine: that imports transformers, slowing the start
from neuron_backend.errors import ShowcaseError
from neuron_backend.image.engine import ImageRequest
from neuron_backend.runtime import Backend


def user_errors(fn):
    """Turn backend errors a user can fix into gr.Error (shown in the UI, returned by the API)."""
    if inspect.isgeneratorfunction(fn):

        @wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except ShowcaseError as exc:
                raise gr.Error(str(exc)) from None

        return gen_wrapper

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ShowcaseError as exc:
            raise gr.Error(str(exc)) from None

    return wrapper


def _optional_int(value):
    return None if value in (None, "") else value


def follow(call, interval: float = 0.1) -> Iterator[tuple[int, int, float] | None]:
    """Yield an image call's progress until it ends; cancel it if the consumer goes away.

    Gradio closes a generator handler when the client disconnects or cancels: the ``finally``
    then stops the engine after its current step, so the next user is not kept waiting.
    """
    try:
        while not call.wait(interval):
            yield call.progress  # None while the request waits for the engine
    finally:
        if not call.wait(0):
            call.cancel()


def save_temp_png(image) -> str:
    with tempfile.NamedTemporaryFile(suffix=".png", delete=False) as f:
        image.save(f, format="PNG")
    return f.name


def add_public_api(backend: Backend, concurrency: dict[str, str]) -> None:
    """The scriptable endpoints (gradio_client): /chat, /generate_image, /status. Call inside the Blocks."""

    @user_errors
    def chat(message: str, history: list | None = None, system_prompt: str | None = None, thinking: bool = False,
             temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
             max_new_tokens: int | None = None, greedy: bool = False, seed: int | None = None) -> Iterator[dict]:
        """Stream a reply: each update is {"reasoning", "answer", "delta", "done", "stats"}."""
        request = ChatRequest(message=message, history=tuple(history or ()), system_prompt=system_prompt or None,
                              thinking=thinking, temperature=temperature, top_p=top_p, top_k=top_k,
                              max_new_tokens=max_new_tokens, greedy=greedy, seed=seed)
        for update in backend.stream_chat(request):
            yield {"reasoning": update.reasoning, "answer": update.answer, "delta": update.delta,
                   "done": update.done, "dropped_turns": update.dropped_turns,
                   "stats": None if update.stats is None else vars(update.stats)}

    def status() -> dict:
        """The warm-up status snapshot (JSON)."""
        return backend.status()

    gr.api(chat, api_name="chat", concurrency_limit=backend.settings.chat_batch,
           concurrency_id=concurrency.get("chat"))
    gr.api(status, api_name="status", queue=False)

    with gr.Column(visible=False):
        api_prompt, api_size = gr.Textbox(), gr.Textbox()
        api_steps, api_seed, api_guidance = gr.JSON(), gr.JSON(), gr.JSON()
        api_png, api_params = gr.File(), gr.JSON()
        api_trigger = gr.Button()

    @user_errors
    def generate_image_api(prompt, size, steps, seed, guidance):
        """Generate one image; returns the PNG (parameters embedded) and its parameters.

        With submit(), progress dicts {"status", "step", "total", "elapsed_s"} stream first.
        """
        request = ImageRequest(prompt=prompt, size=size, steps=_optional_int(steps), seed=_optional_int(seed),
                               guidance=guidance)
        call = backend.start_image(request)
        started = time.perf_counter()
        for state in follow(call):
            # Progress updates stream to clients that submit(); each one also lets the server
            # notice a client that went away (and then stop the image within a step).
            step, total, _ = state or (0, None, 0.0)
            yield gr.skip(), {"status": "running" if state else "waiting", "step": step, "total": total,
                              "elapsed_s": round(time.perf_counter() - started, 2)}
        result = call.result()
        path = str(result.path) if result.path else save_temp_png(result.image)
        yield path, result.params

    api_trigger.click(generate_image_api, [api_prompt, api_size, api_steps, api_seed, api_guidance],
                      [api_png, api_params], api_name="generate_image", concurrency_limit=1,
                      concurrency_id=concurrency.get("image"))
