"""The Chat tab: a ChatInterface over ``Backend.stream_chat``, stats, context meter and exports."""

from __future__ import annotations

import json

import gradio as gr

from neuron_backend.chat.text import ChatRequest
from neuron_backend.runtime import Backend

from .chat_saved import keep_saved_chats, remember_reply, wire_feedback
from .chat_view import DEMO_THINKING_NOTE, LiteralChatbot, StoppedReplies, chat_refusals, current_session, session_of
from .presentation import chat_stats_text, context_meter_text, conversation_markdown

EXAMPLE_PROMPTS = [
    "Explain what a NeuronCore is in two sentences.",
    "Write a haiku about compilers.",
    "What is 17 * 23? Think it through.",
]


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


def build_chat_tab(backend: Backend) -> None:
    """Components and events of the Chat tab (call inside a gr.Tab)."""
    settings = backend.settings
    chat_stats = gr.Markdown(elem_id="chat-stats")
    context_meter = gr.Markdown(context_meter_text(None, settings.buckets, settings.context_length),
                                elem_id="context-meter")
    system_prompt = gr.Textbox(label="System prompt", placeholder="You are a helpful assistant.",
                               lines=1, render=False)
    thinking = gr.Checkbox(label="Thinking (show the model's reasoning)", value=False, render=False,
                           info=DEMO_THINKING_NOTE if settings.demo else None)
    temperature = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label="Temperature", render=False)
    top_p = gr.Slider(0.05, 1.0, value=0.8, step=0.05, label="top_p", render=False)
    top_k = gr.Slider(0, 100, value=20, step=1, label="top_k", render=False)
    max_new = gr.Slider(1, settings.max_new_tokens, value=settings.max_new_tokens, step=1,
                        label="Max new tokens", render=False)
    greedy = gr.Checkbox(label="Greedy (no sampling)", value=False, render=False)
    # Gradio 6.31 shows a Number of value None as 0 and sends 0 until it is cleared: -1 means random.
    chat_seed = gr.Number(label="Seed (-1 = random)", value=-1, minimum=-1, precision=0, render=False)

    stopped_replies = StoppedReplies(backend)  # a stopped reply keeps its stats line (chat_view.py)

    @chat_refusals(lambda: len(chat.additional_outputs))  # a refusal: a note, the other outputs kept
    def send_message(message, history, system, think, temp, p, k, max_tokens, is_greedy, seed, remembered):
        request = ChatRequest(
            message=_text(message), history=tuple(history_for_engine(history)),
            system_prompt=system or None, thinking=bool(think), temperature=temp, top_p=p,
            top_k=int(k), max_new_tokens=int(max_tokens), greedy=bool(is_greedy),
            seed=None if seed is None or seed < 0 else int(seed),
        )
        update = None
        for update in stopped_replies.stream(current_session(), request):
            yield reply_messages(update), gr.skip(), gr.skip(), gr.skip()
        if update is not None:
            yield (reply_messages(update), chat_stats_text(update.stats),
                   context_meter_text(update.stats, settings.buckets, settings.context_length),
                   remember_reply(remembered, request, update))  # for a later 👍/👎 (chat_saved.py)

    # Text shows exactly as typed or generated, nothing live (LiteralChatbot escapes it for the renderer).
    chatbot = LiteralChatbot(label="Qwen3", height=420, elem_id="chatbot", editable="user",
                             sanitize_html=True, allow_tags=False, buttons=["copy", "copy_all"])
    reply_records = gr.State({})  # this session's finished replies: settings and stats (chat_saved.py)
    chat = gr.ChatInterface(
        send_message, chatbot=chatbot, additional_inputs=[system_prompt, thinking, temperature, top_p,
                                                         top_k, max_new, greedy, chat_seed, reply_records],
        additional_inputs_accordion=gr.Accordion("Sampling and system prompt", open=False, render=False),
        additional_outputs=[chat_stats, context_meter, reply_records], examples=[[e] for e in EXAMPLE_PROMPTS],
        run_examples_on_click=False, editable=True, concurrency_limit=settings.chat_batch,
        api_visibility="private", fill_height=False, save_history=True,
    )
    keep_saved_chats(chat, settings.cache_dir)  # saved chats live in the visitor's browser
    wire_feedback(backend, chatbot, reply_records)

    def show_stopped_stats(request: gr.Request):
        final = stopped_replies.stopped(session_of(request))
        if final is None:
            return gr.skip(), gr.skip()
        return (chat_stats_text(final.stats),
                context_meter_text(final.stats, settings.buckets, settings.context_length))

    chat.textbox.stop(show_stopped_stats, None, [chat_stats, context_meter], queue=False, api_visibility="private")

    # Undo and clear take away the reply whose stats are shown: take the stats away too.
    def forget_stats():
        return "", context_meter_text(None, settings.buckets, settings.context_length)

    for event in (chatbot.undo, chatbot.clear):
        event(forget_stats, None, [chat_stats, context_meter], api_visibility="private", queue=False)
    with gr.Row():
        export_json_btn = gr.Button("Export JSON", size="sm", elem_id="export-json")
        export_md_btn = gr.Button("Export Markdown", size="sm", elem_id="export-md")
    export_file = gr.File(label="Conversation export", height=90, elem_id="export-file")

    def export_conversation_json(history):
        return str(backend.exports.write(json.dumps(history or [], ensure_ascii=False, indent=1, default=str),
                                          ".json", "conversation"))

    def export_conversation_markdown(history):
        return str(backend.exports.write(conversation_markdown(history or []), ".md", "conversation"))

    export_json_btn.click(export_conversation_json, chatbot, export_file, api_visibility="private")
    export_md_btn.click(export_conversation_markdown, chatbot, export_file, api_visibility="private")

    def follow_thinking_defaults(think):
        # Qwen's recommended sampling per mode (NOTES.md section 2).
        return (0.6, 0.95) if think else (0.7, 0.8)

    thinking.change(follow_thinking_defaults, thinking, [temperature, top_p], api_visibility="private")
