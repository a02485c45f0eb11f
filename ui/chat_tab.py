"""The Chat tab: a ChatInterface over ``Backend.stream_chat``, stats, context meter and saved chats; rows
plug-ins add under the chat (``extras``, each wired to the tab's ``ChatForm``).

Text shows exactly as typed (``LiteralChatbot``), a stopped reply keeps its stats (``StoppedReplies``), and
saved chats live in the visitor's browser. How and why: docs/page.md, "The Chat tab underneath".
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import wraps
from pathlib import Path

import gradio as gr
from gradio.components.chatbot import TextMessage
from gradio.context import Context, LocalContext

from neuron_backend.chat.text import (
    NOTICE_PREFIX,
    REASONING_TITLE,
    ChatRequest,
    HistoryLimits,
    reply_notices,
    trim_to_limits,
)
from neuron_backend.errors import ShowcaseError
from neuron_backend.metrics import measured
from neuron_backend.runtime import Backend

from .api import queued_at, shown
from .i18n import bilingual_html, lang, localized, say, t
from .presentation import (
    chat_stats_text,
    context_meter_text,
    markdown_literal,
    markdown_unliteral,
)

# ----- how the tab shows things: text as typed, refusals, stopped replies -------------------------------
MAX_SESSIONS = 1000  # stopped replies kept, one per browser session


class LiteralChatbot(gr.Chatbot):
    """A Chatbot that shows every message's text exactly as typed or generated: Markdown, no live HTML.

    Texts go to the page escaped (``markdown_literal``) and come back unescaped, and Gradio's ``cleandoc`` of
    string messages is skipped, so handlers, history and exports see the text itself, indentation included.
    """

    is_template = True
    under: tuple = ()  # components drawn right under the chatbot, wherever it is placed (``render``)

    def render(self):
        """Place the chatbot, then ``under`` right after it. ChatInterface places the chatbot and then
        its message box in one column: this is the one place between the two."""
        super().render()
        for component in self.under:
            if not component.is_rendered:
                component.render()
        return self

    def _postprocess_content(self, chat_message):
        if isinstance(chat_message, str):
            return TextMessage(text=markdown_literal(chat_message))
        if isinstance(chat_message, dict) and chat_message.get("type") == "text":
            return TextMessage(text=markdown_literal(str(chat_message.get("text", ""))))
        return super()._postprocess_content(chat_message)

    def _preprocess_content(self, chat_message):
        content = super()._preprocess_content(chat_message)
        if isinstance(chat_message, TextMessage):
            content["text"] = markdown_unliteral(content["text"])
        return content


class PlaceholderChat(gr.ChatInterface):
    """A ChatInterface whose message box keeps its placeholder: Gradio's empties it when a message is sent
    and never puts it back, so after the first message the box no longer said what it is for."""

    def _clear_and_save_textbox(self, message):
        return type(self.textbox)("", interactive=False, placeholder=self.textbox.placeholder), message


def refusal_note(message: str) -> list[gr.ChatMessage]:
    """The reply slot of a refused message: a titled note (titled messages never go back to the model),
    titled "⚠ Not answered" in the page's language; ``message`` as it is (the chatbot escapes it)."""
    return [gr.ChatMessage(role="assistant", content=message,
                           metadata={"title": say("⚠ Not answered"), "status": "done"})]


def chat_refusals(extra_outputs: Callable[[], int]):
    """For the ChatInterface handler: a refusal ends the reply with a note and one warning toast, never
    ``gr.Error`` (which leaves Gradio 6.31's ChatInterface stuck). ``extra_outputs()``: how many
    ``additional_outputs`` the interface has (they are left as they are)."""

    def decorate(fn):
        @wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except ShowcaseError as exc:  # in the page's language; the toast is HTML (escaped), the note is not
                gr.Warning(shown(exc))
                yield (refusal_note(localized(exc)), *([gr.skip()] * extra_outputs()))

        return wrapper

    return decorate


class StoppedReplies:
    """Keeps the final update (with stats, marked stopped) of a reply the visitor stopped: ``stream`` keeps it,
    ``stopped`` (the Stop button's listener) waits up to ``wait_s`` for it (docs/page.md, "Stop keeps the stats").
    Thread-safety: one entry per browser session, guarded by ``_lock``."""

    def __init__(self, backend: Backend, wait_s: float = 5.0):
        self.backend, self.wait_s = backend, wait_s
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[threading.Event, list]] = {}

    def _fresh(self, session: str) -> tuple[threading.Event, list]:
        with self._lock:
            self._kept.pop(session, None)
            self._kept[session] = entry = (threading.Event(), [])
            while len(self._kept) > MAX_SESSIONS:  # the oldest sessions go first
                self._kept.pop(next(iter(self._kept)))
            return entry

    def stream(self, session: str, request) -> Iterator:
        """``Backend.stream_chat(request)``, keeping the final update if the consumer stops early."""
        done, kept = self._fresh(session)
        stop = threading.Event()  # in a chat batch: this reply's own row stop (ChatEngine.stream)
        stream = self.backend.stream_chat(request, stop)
        finished, update = False, None
        try:
            for update in stream:  # noqa: UP028 - ``yield from`` would close ``stream`` when we are closed
                yield update
            finished = True
        finally:
            if not finished:
                self._finish_stopped(stream, stop, kept, update)
            done.set()

    def _finish_stopped(self, stream, stop: threading.Event, kept: list, given) -> None:
        """End the stream; keep its final update (the drain's, or the given one a Stop as it ended never showed)."""
        if self.backend.chat_slots() > 1:  # its own row's stop: Stop must not end another visitor's reply
            stop.set()
        else:
            self.backend.cancel("chat")
        last = given
        try:
            for last in stream:  # noqa: B007 - within one token the engine ends with its stats
                pass
        except Exception:  # noqa: BLE001 - nothing to show then; the reply was stopped anyway
            return
        if last is not None and last.stats is not None:
            kept.append(last)

    def stopped(self, session: str):
        """The stopped reply's final update, or None (no reply stopped, or the stats never came)."""
        with self._lock:
            entry = self._kept.get(session)
        if entry is None:
            return None
        done, kept = entry
        done.wait(self.wait_s)
        with self._lock:  # shown once: a later Stop before the next reply starts finds nothing
            if self._kept.get(session) is entry and done.is_set():
                del self._kept[session]
        return kept[-1] if kept else None


def stopped_history(history, final) -> list:
    """The chat once a Stop came: up to the last message sent, then the stopped reply's text so far (the
    final update's when it came, else what the page showed), or a note that it stopped before any text."""
    messages = list(history or [])
    sent = max((i for i, m in enumerate(messages) if _role(m) == "user"), default=-1)
    kept, shown = messages[:sent + 1], messages[sent + 1:]
    if final is not None and (final.answer + final.reasoning).strip():
        return kept + reply_messages(final)
    if any(_text(m).strip() for m in shown):
        return messages
    return kept + [gr.ChatMessage(role="assistant", content=say("Retry sends the message again."),
                                  metadata={"title": f"⏹ {say('Stopped before any text')}", "status": "done"})]


def _role(message) -> str | None:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def _text(message) -> str:
    """A chatbot message's text (its content a string, or Gradio's list of typed parts)."""
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", "")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def session_of(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "anonymous"


def current_session() -> str:
    """The browser session of the event being handled (ChatInterface passes its handler no gr.Request)."""
    return session_of(LocalContext.request.get(None))


# ----- saved chats and the reply records a 👍/👎 mark reads ----------------------------------------
SAVED_CHATS_KEY = "showcase-saved-chats"
MAX_REMEMBERED_REPLIES = 64  # per session: replies whose settings a later mark can still find


def reply_key(answer: str) -> str:
    """The key of a reply's record in the session's reply records (chat extras read them too)."""
    return hashlib.sha1(answer.strip().encode("utf-8", "replace"), usedforsecurity=False).hexdigest()[:16]


def browser_secret(cache_dir: Path) -> str:
    """The saved chats' encryption secret, made once and kept under the cache root (random if unwritable)."""
    path = Path(cache_dir) / "browser-state-secret"
    try:
        text = path.read_text().strip()
        if len(text) >= 16:
            return text
    except OSError:
        pass
    value = secrets.token_urlsafe(24)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(value)
    except OSError:
        pass  # a read-only cache root: chats then last until the next restart only
    return value


def keep_saved_chats(chat: gr.ChatInterface, cache_dir: Path) -> None:
    """Fix the saved chats' storage key and secret (call right after building a ChatInterface with save_history)."""
    chat.saved_conversations.storage_key = SAVED_CHATS_KEY
    chat.saved_conversations.secret = browser_secret(cache_dir)


def remember_reply(records: dict | None, request, update) -> dict:
    """The session's reply records plus this finished reply's settings and stats, keyed by its answer."""
    records = dict(records or {})
    stats = vars(update.stats) if update.stats is not None else {}
    records[reply_key(update.answer)] = {
        "settings": {"system_prompt": request.system_prompt, "thinking": request.thinking,
                     "greedy": request.greedy, "temperature": request.temperature, "top_p": request.top_p,
                     "top_k": request.top_k, "max_new_tokens": request.max_new_tokens,
                     "seed": stats.get("seed", request.seed)},
        "stats": stats,
    }
    while len(records) > MAX_REMEMBERED_REPLIES:
        records.pop(next(iter(records)))
    return records


def produced_reply(records: dict | None, answer: str) -> dict:
    """The record of ``answer`` when this server produced it in this session, else {} (a reply typed by the
    client, or one a loaded conversation file brought: its stats are the file's, not measured here)."""
    record = (records or {}).get(reply_key(answer)) or {}
    return {} if record.get("loaded") else record


# ----- the tab ---------------------------------------------------------------------------------------------
EXAMPLE_PROMPTS = [
    "Explain what a NeuronCore is in two sentences.",
    "Write a haiku about compilers.",
    "What is 17 * 23? Think it through.",
]


def reply_messages(update, request: ChatRequest | None = None, server_max: int | None = None) -> list[gr.ChatMessage]:
    """A chat update as chatbot messages: folded reasoning first, then the answer, then (when done)
    notices such as "stopped at the token limit" (bubbles: shown, never fed back to the model).
    Titles and notices are in the page's language; ``server_max``: the server's --max-new-tokens."""
    messages = []
    if update.reasoning:
        status = "done" if update.answer or update.done else "pending"
        messages.append(gr.ChatMessage(role="assistant", content=update.reasoning,
                                       metadata={"title": localized(REASONING_TITLE), "status": status}))
    if update.answer or not messages:
        messages.append(gr.ChatMessage(role="assistant", content=update.answer))
    if update.done:
        for notice in reply_notices(update, request, server_max):
            messages.append(gr.ChatMessage(role="assistant", content=localized(notice.detail),
                                           metadata={"title": f"{NOTICE_PREFIX} {localized(notice.title)}"}))
        if not (update.answer + update.reasoning).strip() and not (update.stats and update.stats.stopped):
            # an empty bubble said nothing (the demo models' random weights often end a reply at once)
            messages.append(gr.ChatMessage(role="assistant", content=say(
                "It ended the reply at its first token: send the message again, or change the seed or the "
                "temperature."), metadata={"title": f"{NOTICE_PREFIX} {say('The model produced no text')}"}))
    return messages


def idle_meter(settings) -> str:
    """The context meter before any reply, built with the page (outside an event): both languages, CSS
    shows the one of ``<html lang>`` (ui/i18n.py ``bilingual_html``). Replies rebuild it in one language."""
    return bilingual_html(lambda: context_meter_text(None, settings.buckets, settings.context_length))


# Stats and context meter under the chatbot in reserved height; below 500 px the chat's column (found by its
# meter) comes first and a placeholder holds the chatbot's place (docs/page.md, "The Chat tab underneath").
CHAT_CSS = """
#chat-stats p, #context-meter p { font-size: var(--text-md); line-height: 1.5; margin: 0; }
#chat-stats { min-height: 4.5rem; }
#context-meter { min-height: 3rem; }
@media (max-width: 499px) { #chat-tab .column:has(> #context-meter) { order: -1; } }
#chat-tab .column:has(> #context-meter):not(:has(> #chatbot))::before { content: ""; height: 420px; }
@media (min-width: 768px) { #chat-stats { min-height: 3rem; } }
@media (min-width: 1200px) { #chat-stats, #context-meter { min-height: 1.5rem; } }
/* The message box's own progress overlay (ChatInterface's events that empty and re-enable it) would lie over Stop
   and catch its click while they wait on the server; the chatbot shows the reply's progress. */
#chat-tab .block:has(> label > .input-container) > [data-testid="status-tracker"] { display: none !important; }
"""


def history_limits(settings) -> HistoryLimits:
    return HistoryLimits(settings.max_history_messages, settings.max_history_chars, settings.max_prompt_chars)


@dataclass(frozen=True)
class ChatForm:
    """The chat and its controls a chat extra may read or set."""

    chat: gr.ChatInterface  # its ``chatbot_value`` sets the chat from outside (it syncs the interface's own state)
    chatbot: gr.Chatbot
    controls: tuple  # system prompt, thinking, temperature, top_p, top_k, max new tokens, greedy, seed
    records: gr.State  # the session's reply records: each finished reply's settings and stats (``remember_reply``)
    after_load: Callable[[object], object]  # after_load(event): once ``event`` has put a conversation in the chat,
    #                                         the stats line and the context meter are cleared


ChatExtra = Callable[[Backend, ChatForm], object]  # (backend, the form) -> its row under the chat


def build_chat_tab(backend: Backend, extras: Sequence[ChatExtra] = ()) -> None:
    """Components and events of the Chat tab (call inside a gr.Tab); each of ``extras`` adds its row under the
    chat, in order, wired to the tab's ``ChatForm`` (the 👍/👎 feedback row, the conversation files)."""
    settings = backend.settings
    # Drawn under the chatbot (LiteralChatbot.under), updated in place: a stopped reply's stats come there too.
    chat_stats = gr.Markdown(elem_id="chat-stats", render=False)
    context_meter = gr.Markdown(idle_meter(settings), elem_id="context-meter", render=False)
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
    stopped_replies = StoppedReplies(backend)  # a stopped reply keeps its stats line

    @chat_refusals(lambda: len(chat.additional_outputs))  # a refusal: a note, the other outputs kept
    @measured(backend.metrics, "chat_tab", queued_at)  # queue wait, refusals, end to end
    def send_message(message, history, system, think, temp, p, k, max_tokens, is_greedy, seed, remembered):
        # The chatbot's messages go as they are: the engine's history normaliser (chat/text.py)
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
            yield (reply_messages(update, request, backend.settings.max_new_tokens), chat_stats_text(update.stats),
                   context_meter_text(update.stats, settings.buckets, settings.context_length),
                   remember_reply(remembered, request, update))  # for a later 👍/👎

    # Text shows exactly as typed or generated, nothing live (LiteralChatbot escapes it for the renderer).
    chatbot = LiteralChatbot(label=t("Qwen3"), height=420, elem_id="chatbot", editable="user",
                             sanitize_html=True, allow_tags=False, buttons=["copy", "copy_all"], render=False)
    chatbot.under = (chat_stats, context_meter)
    reply_records = gr.State({})  # this session's finished replies: settings and stats
    chat = PlaceholderChat(
        send_message, chatbot=chatbot, additional_inputs=[system_prompt, thinking, temperature, top_p,
                                                         top_k, max_new, greedy, chat_seed, reply_records],
        additional_inputs_accordion=gr.Accordion(t("Sampling and system prompt"), open=False, render=False),
        additional_outputs=[chat_stats, context_meter, reply_records], examples=[[e] for e in EXAMPLE_PROMPTS],
        examples_label=t("Examples"), editable=True,  # a click sends the example, as the visitor expects
        concurrency_limit=backend.chat_slots(), api_visibility="private", fill_height=False, save_history=True,
        autofocus=False,  # focusing the box on load scrolls a phone's page past the header and the warm-up bar
    )
    keep_saved_chats(chat, settings.cache_dir)  # saved chats live in the visitor's browser
    # The example chips in the page's language (what a click sends): built in English, set per visitor on load.
    gr.on([Context.root_block.load], lambda: gr.skip() if lang() == "en" else gr.update(examples=[{"text": say(e)}
                                                                                 for e in EXAMPLE_PROMPTS]),
          None, chatbot, queue=False, api_visibility="private", show_progress="hidden")

    # A Stop keeps the reply: its text so far or a note, and its stats. The chat's state follows the chatbot,
    # so Retry, Undo and the next message see the same conversation the page shows.
    def show_stopped_reply(history, request: gr.Request):
        final = stopped_replies.stopped(session_of(request))
        shown = stopped_history(history, final)
        if final is None:
            return shown, shown, gr.skip(), gr.skip()
        return (shown, shown, chat_stats_text(final.stats),
                context_meter_text(final.stats, settings.buckets, settings.context_length))

    chat.textbox.stop(show_stopped_reply, chatbot, [chatbot, chat.chatbot_state, chat_stats, context_meter],
                      queue=False, api_visibility="private")

    # A new reply's stats replace the last one's: the line is empty while it runs, emptied in the browser at
    # once (a server round trip could land after the reply's event started, showing the old numbers meanwhile).
    for start in (chat.textbox.submit, chatbot.retry, chatbot.edit, chatbot.example_select):
        start(None, None, chat_stats, js="() => ''", queue=False, api_visibility="private", show_progress="hidden")

    # Undo and clear take away the reply whose stats are shown: take the stats away too.
    def forget_stats():
        return "", context_meter_text(None, settings.buckets, settings.context_length)

    for event in (chatbot.undo, chatbot.clear):
        event(forget_stats, None, [chat_stats, context_meter], api_visibility="private", queue=False)
    # A loaded conversation replaces the chat: the last reply's stats and meter no longer describe it.
    def after_load(event):
        return event.success(forget_stats, None, [chat_stats, context_meter], api_visibility="private", queue=False)

    form = ChatForm(chat, chatbot, (system_prompt, thinking, temperature, top_p, top_k, max_new, greedy, chat_seed),
                    reply_records, after_load)
    for extra in extras:  # their rows under the chat, in the plug-ins' order
        extra(backend, form)

    def follow_thinking_defaults(think):
        # Qwen3's model card: thinking T 0.6 / top-p 0.95, non-thinking T 0.7 / top-p 0.8 (top-k 20 in both).
        return (0.6, 0.95) if think else (0.7, 0.8)

    # .input, not .change: a loaded conversation sets thinking and its own temperature together
    thinking.input(follow_thinking_defaults, thinking, [temperature, top_p], api_visibility="private")
