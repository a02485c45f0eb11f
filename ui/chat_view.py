"""How the Chat tab shows things: text exactly as typed, refusals that leave the tab usable, stopped replies' stats."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import wraps

import gradio as gr
from gradio.components.chatbot import TextMessage
from gradio.context import LocalContext

from neuron_backend.errors import ShowcaseError
from neuron_backend.runtime import Backend

from .api import shown
from .i18n import localized, say
from .presentation import markdown_literal, markdown_unliteral

MAX_SESSIONS = 1000  # stopped replies kept, one per browser session


class LiteralChatbot(gr.Chatbot):
    """A Chatbot that shows every message's text exactly as typed or generated: Markdown, no live HTML.

    Gradio's Chatbot renders Markdown with raw HTML in it: its sanitizer deletes tags it does not
    know (``List<String>`` shows as ``List``) and keeps others live (a styled ``<div>``, ``<a>``,
    ``<details>``). Here each text leaves escaped (``markdown_literal``) and comes back unescaped, so
    handlers, history and exports see the text itself. Gradio's own ``inspect.cleandoc`` of string
    messages is skipped too: indentation stays. Drawn by the frontend's Chatbot (``is_template``).
    """

    is_template = True

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


def refusal_note(message: str) -> list[gr.ChatMessage]:
    """The reply slot of a refused message: a titled note (titled messages never go back to the model),
    titled "⚠ Not answered" in the page's language; ``message`` as it is (the chatbot escapes it)."""
    return [gr.ChatMessage(role="assistant", content=message,
                           metadata={"title": say("⚠ Not answered"), "status": "done"})]


def chat_refusals(extra_outputs: Callable[[], int]):
    """For the ChatInterface handler: a refusal ends the reply with a note and one warning toast.

    Raising gr.Error there leaves Gradio 6.31's ChatInterface stuck (message box disabled, Stop
    showing) and paints an error on every output; ending normally lets it re-enable the box.
    ``extra_outputs()``: how many ``additional_outputs`` the interface has (they are left as they are).
    """

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
    """Keeps the final update (with stats, marked stopped) of a reply the visitor stopped.

    Gradio ends a handler on Stop by closing its generator, so the last update, the one with the
    stats, never reaches the page. ``stream`` catches that close: it stops this reply within one
    token, drains it to its final update and keeps it for ``stopped`` (the Stop button's own
    listener), which waits up to ``wait_s`` for it. How it stops only this reply: on the
    one-reply-at-a-time path the suspended reply holds the engine's job lock, so ``cancel`` stops
    exactly it; with ``--chat-batch`` the reply's own ``stop`` event ends its row (the other users'
    rows run on). Thread-safety: one entry per browser session, guarded by ``_lock``.
    """

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
        stop = threading.Event()  # --chat-batch: this reply's own row stop (ChatEngine.stream)
        stream = self.backend.stream_chat(request, stop)
        finished = False
        try:
            for update in stream:  # noqa: UP028 - ``yield from`` would close ``stream`` when we are closed
                yield update
            finished = True
        finally:
            if not finished:
                self._finish_stopped(stream, stop, kept)
            done.set()

    def _finish_stopped(self, stream, stop: threading.Event, kept: list) -> None:
        if self.backend.settings.chat_batch > 1:
            stop.set()
        else:
            self.backend.cancel("chat")
        last = None
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


def session_of(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "anonymous"


def current_session() -> str:
    """The browser session of the event being handled (ChatInterface passes its handler no gr.Request)."""
    return session_of(LocalContext.request.get(None))
