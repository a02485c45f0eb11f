"""The Chat tab: a ChatInterface over ``Backend.stream_chat``, stats, context meter and exports."""

from __future__ import annotations

import gradio as gr

from neuron_backend.chat.history import NOTICE_PREFIX, REASONING_TITLE, trim_to_limits
from neuron_backend.chat.text import ChatRequest, reply_notices
from neuron_backend.runtime import Backend

from .chat_export import history_limits, wire_conversation_files
from .chat_saved import keep_saved_chats, remember_reply, wire_feedback
from .chat_view import LiteralChatbot, StoppedReplies, chat_refusals, current_session, session_of
from .i18n import bilingual_html, localized, t
from .presentation import chat_stats_text, context_meter_text

EXAMPLE_PROMPTS = [
    "Explain what a NeuronCore is in two sentences.",
    "Write a haiku about compilers.",
    "What is 17 * 23? Think it through.",
]


def reply_messages(update, request: ChatRequest | None = None) -> list[gr.ChatMessage]:
    """A chat update as chatbot messages: folded reasoning first, then the answer, then (when done)
    notices such as "stopped at the token limit" (bubbles: shown, never fed back to the model).
    Titles and notices are in the page's language."""
    messages = []
    if update.reasoning:
        status = "done" if update.answer or update.done else "pending"
        messages.append(gr.ChatMessage(role="assistant", content=update.reasoning,
                                       metadata={"title": localized(REASONING_TITLE), "status": status}))
    if update.answer or not messages:
        messages.append(gr.ChatMessage(role="assistant", content=update.answer))
    if update.done:
        for notice in reply_notices(update, request):
            messages.append(gr.ChatMessage(role="assistant", content=localized(notice.detail),
                                           metadata={"title": f"{NOTICE_PREFIX} {localized(notice.title)}"}))
    return messages


def idle_meter(settings) -> str:
    """The context meter before any reply, built with the page (outside an event): both languages, CSS
    shows the one of ``<html lang>`` (ui/i18n.py ``bilingual_html``). Replies rebuild it in one language."""
    return bilingual_html(lambda: context_meter_text(None, settings.buckets, settings.context_length))


def build_chat_tab(backend: Backend) -> None:
    """Components and events of the Chat tab (call inside a gr.Tab)."""
    settings = backend.settings
    chat_stats = gr.Markdown(elem_id="chat-stats")
    context_meter = gr.Markdown(idle_meter(settings), elem_id="context-meter")
    system_prompt = gr.Textbox(label=t("System prompt"), placeholder=t("You are a helpful assistant."),
                               lines=1, render=False)
    thinking = gr.Checkbox(label=t("Thinking (show the model's reasoning)"), value=False, render=False,
                           info=t("The demo model never reasons (its vocabulary leaves out the <think> tags), so no "
                                  "reasoning shows here; the toggle still switches to Qwen's thinking sampling "
                                  "defaults.") if settings.demo else None)
    temperature = gr.Slider(0.05, 2.0, value=0.7, step=0.05, label=t("Temperature"), render=False)
    top_p = gr.Slider(0.05, 1.0, value=0.8, step=0.05, label=t("top_p"), render=False)
    top_k = gr.Slider(0, 100, value=20, step=1, label=t("top_k"), render=False)
    max_new = gr.Slider(1, settings.max_new_tokens, value=settings.max_new_tokens, step=1,
                        label=t("Max new tokens"), render=False)
    greedy = gr.Checkbox(label=t("Greedy (no sampling)"), value=False, render=False)
    # Gradio 6.31 shows a Number of value None as 0 and sends 0 until it is cleared: -1 means random.
    chat_seed = gr.Number(label=t("Seed (-1 = random)"), value=-1, minimum=-1, precision=0, render=False)

    limits = history_limits(settings)
    stopped_replies = StoppedReplies(backend)  # a stopped reply keeps its stats line (chat_view.py)

    @chat_refusals(lambda: len(chat.additional_outputs))  # a refusal: a note, the other outputs kept
    def send_message(message, history, system, think, temp, p, k, max_tokens, is_greedy, seed, remembered):
        # The chatbot's messages go as they are: the engine's history normaliser (chat/history.py)
        # reads text parts and drops the folded bubbles; the oldest turns beyond the limits stay home.
        request = ChatRequest(
            message=message, history=trim_to_limits(history or [], limits),
            system_prompt=system or None, thinking=bool(think), temperature=temp, top_p=p,
            top_k=int(k), max_new_tokens=int(max_tokens), greedy=bool(is_greedy),
            seed=None if seed is None or seed < 0 else int(seed),
        )
        update = None
        for update in stopped_replies.stream(current_session(), request):
            yield reply_messages(update), gr.skip(), gr.skip(), gr.skip()
        if update is not None:
            yield (reply_messages(update, request), chat_stats_text(update.stats),
                   context_meter_text(update.stats, settings.buckets, settings.context_length),
                   remember_reply(remembered, request, update))  # for a later 👍/👎 (chat_saved.py)

    # Text shows exactly as typed or generated, nothing live (LiteralChatbot escapes it for the renderer).
    chatbot = LiteralChatbot(label=t("Qwen3"), height=420, elem_id="chatbot", editable="user",
                             sanitize_html=True, allow_tags=False, buttons=["copy", "copy_all"])
    reply_records = gr.State({})  # this session's finished replies: settings and stats (chat_saved.py)
    chat = gr.ChatInterface(
        send_message, chatbot=chatbot, additional_inputs=[system_prompt, thinking, temperature, top_p,
                                                         top_k, max_new, greedy, chat_seed, reply_records],
        additional_inputs_accordion=gr.Accordion(t("Sampling and system prompt"), open=False, render=False),
        additional_outputs=[chat_stats, context_meter, reply_records], examples=[[e] for e in EXAMPLE_PROMPTS],
        examples_label=t("Examples"), run_examples_on_click=False, editable=True,
        concurrency_limit=settings.chat_batch, api_visibility="private", fill_height=False, save_history=True,
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
    # Export JSON / Markdown and Load JSON (chat_export.py)
    loaded = wire_conversation_files(backend, chat, [system_prompt, thinking, temperature, top_p, top_k, max_new,
                                                     greedy, chat_seed], reply_records)
    # A loaded conversation replaces the chat: the last reply's stats and meter no longer describe it.
    loaded.success(forget_stats, None, [chat_stats, context_meter], api_visibility="private", queue=False)

    def follow_thinking_defaults(think):
        # Qwen3's model card: thinking T 0.6 / top-p 0.95, non-thinking T 0.7 / top-p 0.8 (top-k 20 in both).
        return (0.6, 0.95) if think else (0.7, 0.8)

    # .input, not .change: a loaded conversation sets thinking and its own temperature together
    thinking.input(follow_thinking_defaults, thinking, [temperature, top_p], api_visibility="private")
