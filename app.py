"""Gradio app: Qwen3 chat and FLUX.2-klein images on AWS Trainium (or whatever this host has).

This file only wires the UI to ``neuron_backend``; handlers are thin and named after what the
user did. Run ``python app.py --help`` for every flag.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import wraps

import gradio as gr

from app_qa import build_qa_tab
from neuron_backend import parallel
from neuron_backend.chat_text import ChatRequest  # not .chat: that imports transformers, slowing the start
from neuron_backend.devices import configure_compile_cache, resolve_placements
from neuron_backend.errors import ShowcaseError
from neuron_backend.image import DEFAULT_GUIDANCE, GUIDANCE_MAX, GUIDANCE_MIN, ImageRequest
from neuron_backend.presentation import (
    chat_stats_text,
    context_meter_text,
    conversation_markdown,
    python_snippet,
    size_choice_label,
    status_bar_html,
    task_rows,
)
from neuron_backend.runtime import Backend, model_folder
from neuron_backend.settings import parse_settings

log = logging.getLogger("showcase.app")
SEED_MAX = 2**32 - 1
EXAMPLE_PROMPTS = [
    "Explain what a NeuronCore is in two sentences.",
    "Write a haiku about compilers.",
    "What is 17 * 23? Think it through.",
]
IMAGE_EXAMPLES = ["a golden retriever surfing a wave, photorealistic", "a lighthouse at dusk, watercolor"]
# Active-content tags a user may type (e.g. asking about HTML): the chatbot shows them as literal text
# (Gradio's allow_tags escapes the listed tags) instead of its sanitizer silently deleting them.
TAGS_SHOWN_AS_TEXT = ["script", "style", "iframe", "img", "svg", "object", "embed", "video", "audio",
                      "form", "input", "textarea", "button", "link", "meta", "base", "math", "noscript"]
TASK_HEADERS = ["task", "shape", "state", "seconds", "compile cache", "error"]


def user_errors(fn):
    """Turn backend errors a user can fix into gr.Error (shown in the UI, returned by the API)."""
    if _is_generator(fn):

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


def _is_generator(fn) -> bool:
    import inspect

    return inspect.isgeneratorfunction(fn)


def _text(content) -> str:
    """Gradio message content may be a string or a list of parts; keep the text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    if isinstance(content, dict):
        return str(content.get("text", ""))
    return "" if content is None else str(content)


def history_for_engine(history: list[dict]) -> list[dict]:
    """Chatbot messages -> engine history: drop folded reasoning blocks, keep role and text."""
    out = []
    for m in history or []:
        if (m.get("metadata") or {}).get("title"):
            continue
        out.append({"role": m.get("role"), "content": _text(m.get("content"))})
    return out


def reply_messages(update) -> list[gr.ChatMessage]:
    """A chat update as chatbot messages: folded reasoning first, then the answer."""
    messages = []
    if update.reasoning:
        status = "done" if update.answer or update.done else "pending"
        messages.append(gr.ChatMessage(role="assistant", content=update.reasoning,
                                       metadata={"title": "💭 Reasoning", "status": status}))
    if update.answer or not messages:
        messages.append(gr.ChatMessage(role="assistant", content=update.answer))
    return messages


def _optional_int(value):
    return None if value in (None, "") else value


def create_demo(backend: Backend) -> gr.Blocks:
    """Build the Blocks; every event calls into ``backend``."""
    settings = backend.settings
    chat_on, image_on = "chat" in backend.placements, "image" in backend.placements
    # Engines on the same device share one queue slot; on different devices they run in parallel.
    concurrency = {name: f"device-{p.device}" for name, p in backend.placements.items()}
    if settings.chat_batch > 1:  # N batch slots: N chat replies at once, in a group of their own
        concurrency["chat"] = "chat-batch"

    # delete_cache: Gradio copies every served file into its cache; drop copies older than an hour, hourly.
    with gr.Blocks(title="Hugging Face on Trainium", delete_cache=(3600, 3600)) as demo:
        status_bar = gr.HTML(status_bar_html(backend.status()), elem_id="status-bar")
        with gr.Accordion("Warm-up details", open=False, elem_id="warmup-details"):
            tasks_table = gr.Dataframe(headers=TASK_HEADERS, value=task_rows(backend.status()),
                                       interactive=False, wrap=True, elem_id="warmup-table")
            details = gr.Markdown(elem_id="warmup-details-text")
        timer = gr.Timer(1.0)

        with gr.Tab("Chat", visible=chat_on, elem_id="chat-tab"):
            chat_stats = gr.Markdown(elem_id="chat-stats")
            context_meter = gr.Markdown(context_meter_text(None, settings.buckets, settings.context_length),
                                        elem_id="context-meter")
            system_prompt = gr.Textbox(label="System prompt", placeholder="You are a helpful assistant.",
                                       lines=1, render=False)
            thinking = gr.Checkbox(label="Thinking (show the model's reasoning)", value=False, render=False)
            temperature = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label="Temperature", render=False)
            top_p = gr.Slider(0.05, 1.0, value=0.8, step=0.05, label="top_p", render=False)
            top_k = gr.Slider(0, 100, value=20, step=1, label="top_k", render=False)
            max_new = gr.Slider(1, settings.max_new_tokens, value=settings.max_new_tokens, step=1,
                                label="Max new tokens", render=False)
            greedy = gr.Checkbox(label="Greedy (no sampling)", value=False, render=False)
            # Gradio 6.31 shows a Number of value None as 0 and sends 0 until it is cleared: -1 means random.
            chat_seed = gr.Number(label="Seed (-1 = random)", value=-1, minimum=-1, precision=0, render=False)

            @user_errors
            def send_message(message, history, system, think, temp, p, k, max_tokens, is_greedy, seed):
                request = ChatRequest(
                    message=_text(message), history=tuple(history_for_engine(history)),
                    system_prompt=system or None, thinking=bool(think), temperature=temp, top_p=p,
                    top_k=int(k), max_new_tokens=int(max_tokens), greedy=bool(is_greedy),
                    seed=None if seed is None or seed < 0 else int(seed),
                )
                update = None
                for update in backend.stream_chat(request):
                    yield reply_messages(update), gr.skip(), gr.skip()
                if update is not None:
                    yield (reply_messages(update), chat_stats_text(update.stats),
                           context_meter_text(update.stats, settings.buckets, settings.context_length))

            chatbot = gr.Chatbot(label="Qwen3", height=420, elem_id="chatbot", editable="user",
                                 sanitize_html=True, allow_tags=TAGS_SHOWN_AS_TEXT, buttons=["copy", "copy_all"])
            gr.ChatInterface(
                send_message, chatbot=chatbot, additional_inputs=[system_prompt, thinking, temperature, top_p,
                                                                 top_k, max_new, greedy, chat_seed],
                additional_inputs_accordion=gr.Accordion("Sampling and system prompt", open=False, render=False),
                additional_outputs=[chat_stats, context_meter], examples=[[e] for e in EXAMPLE_PROMPTS],
                run_examples_on_click=False, editable=True, concurrency_limit=settings.chat_batch,
                api_visibility="private", fill_height=False,
            )
            # Undo and clear take away the reply whose stats are shown: take the stats away too.
            def forget_stats():
                return "", context_meter_text(None, settings.buckets, settings.context_length)

            for event in (chatbot.undo, chatbot.clear):
                event(forget_stats, None, [chat_stats, context_meter], api_visibility="private", queue=False)
            # Queue bookkeeping for the shared device slot happens on the chat event itself.
            with gr.Row():
                export_json_btn = gr.Button("Export JSON", size="sm", elem_id="export-json")
                export_md_btn = gr.Button("Export Markdown", size="sm", elem_id="export-md")
            export_file = gr.File(label="Conversation export", height=90, elem_id="export-file")

            def export_conversation_json(history):
                return _write_export(json.dumps(history or [], ensure_ascii=False, indent=1, default=str), ".json")

            def export_conversation_markdown(history):
                return _write_export(conversation_markdown(history or []), ".md")

            export_json_btn.click(export_conversation_json, chatbot, export_file, api_visibility="private")
            export_md_btn.click(export_conversation_markdown, chatbot, export_file, api_visibility="private")

            def follow_thinking_defaults(think):
                # Qwen's recommended sampling per mode (NOTES.md section 2).
                return (0.6, 0.95) if think else (0.7, 0.8)

            thinking.change(follow_thinking_defaults, thinking, [temperature, top_p], api_visibility="private")

        with gr.Tab("Image", visible=image_on, elem_id="image-tab"):
            last_seed = gr.State(None)
            session_gallery = gr.State([])
            with gr.Row():
                with gr.Column(scale=2):
                    prompt = gr.Textbox(label="Prompt", lines=2, elem_id="image-prompt",
                                        max_length=settings.max_prompt_chars)
                    size = gr.Dropdown(choices=_size_choices(backend), value=settings.sizes[0].label,
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
                path = str(result.path) if result.path else _save_temp_png(result.image)
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

        with gr.Tab("QA bench", elem_id="qa-tab"):
            build_qa_tab(backend)

        def refresh_status(previous_choices):
            status = backend.status()
            choices = _size_choices(backend)
            size_update = gr.update(choices=choices) if choices != previous_choices else gr.skip()
            timer_update = gr.Timer(active=True, value=1.0 if not status["ready"] else 5.0)
            return (status_bar_html(status), task_rows(status), _details_markdown(status), size_update, choices,
                    timer_update, gr.update(visible=not backend.image_distilled()))

        size_choices_state = gr.State(_size_choices(backend))
        timer.tick(refresh_status, size_choices_state,
                   [status_bar, tasks_table, details, size, size_choices_state, timer, guidance],
                   queue=False, api_visibility="private")
        demo.load(refresh_status, size_choices_state,
                  [status_bar, tasks_table, details, size, size_choices_state, timer, guidance],
                  queue=False, api_visibility="private")

        _public_api(backend, concurrency)
    return demo


def _public_api(backend: Backend, concurrency: dict[str, str]) -> None:
    """The scriptable endpoints (gradio_client): /chat, /generate_image, /status."""

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
        path = str(result.path) if result.path else _save_temp_png(result.image)
        yield path, result.params

    api_trigger.click(generate_image_api, [api_prompt, api_size, api_steps, api_seed, api_guidance],
                      [api_png, api_params], api_name="generate_image", concurrency_limit=1,
                      concurrency_id=concurrency.get("image"))


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


def _size_choices(backend: Backend) -> list[tuple[str, str]]:
    states = backend.shape_states("image") if "image" in backend.placements else {}
    return [(size_choice_label(s, states.get(s.label)), s.label) for s in backend.settings.sizes]


def _details_markdown(status: dict) -> str:
    device = status["device"]
    lines = [f"**Runs on:** {status['banner']}", f"**Models:** {status['models_reason']}",
             f"**Device:** {device['accelerator']}"]
    for name, engine in status["engines"].items():
        lines.append(f"**{name} engine:** {engine['state']}" + (f" — {engine['reason']}" if engine["reason"] else ""))
    lines.append(f"**Compile cache:** `{status['cache_dir']}/compile-cache`"
                 + (f" ⚠ {status['cache_problem']}" if status["cache_problem"] else ""))
    lines.append(f"**Graph compiles after warm-up:** {status['compiles_since_ready']}")
    versions = ", ".join(f"{k} {v}" for k, v in device["versions"].items())
    lines.append(f"**Software:** {versions}")
    return "\n\n".join(lines)


def _write_export(text: str, suffix: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=suffix, prefix="conversation-", delete=False,
                                     encoding="utf-8") as f:
        f.write(text)
    return f.name


def _save_temp_png(image) -> str:
    with tempfile.NamedTemporaryFile(suffix=".png", delete=False) as f:
        image.save(f, format="PNG")
    return f.name


def launch(backend: Backend, **kwargs):
    """Start warm-up in the background and serve the UI at once."""
    settings = backend.settings
    demo = create_demo(backend)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=1)
    backend.start()
    return demo.launch(server_name=settings.host, server_port=settings.port, share=settings.share,
                       auth=settings.auth, show_error=True, **kwargs)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = parse_settings(argv)
        if settings.tp > 1:  # under torchrun: --tp-engine names the sharded engine
            placement = resolve_placements(settings)[settings.tp_engine]
            # Weights first: saving (the demo build) under a process group writes only on rank 0.
            folder = model_folder(settings, settings.tp_engine)
            parallel.init(settings, placement)
            if settings.rank != 0:  # followers serve no UI: they mirror rank 0's generations
                configure_compile_cache(settings.cache_dir)
                parallel.run_follower(settings, placement, folder)
                return
        backend = Backend(settings)
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    backend.log_startup()
    try:
        launch(backend)
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
