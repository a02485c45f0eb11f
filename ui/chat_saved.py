"""The Chat tab's saved chats (kept in the visitor's browser) and 👍/👎 feedback on replies.

Saved chats: ChatInterface's ``save_history`` keeps every conversation in the browser's
localStorage (a ``gr.BrowserState``), listed in the panel beside the chat: "New chat" starts one,
a click reopens one, the chatbot's 🗑 (clear) deletes the open one. Nothing is stored on the server,
so no visitor sees another's chats. The storage key is fixed and the encryption secret is kept
under the cache root, so saved chats also survive a server restart (Gradio's default secret is
new at every start, which would silently empty every visitor's list).

Feedback: the chatbot's thumbs mark a reply; the mark goes to ``neuron_backend.feedback`` with
the reply's settings and stats (remembered per reply in the session when it finished, so only a
reply this server produced in this session carries them), and a comment box appears for an
optional comment on that mark. A session stores at most ``MAX_MARKS_PER_SESSION`` marks (counted in
a ``gr.State``, which lives on the server: the page cannot reset it short of opening a new session).
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import gradio as gr

from neuron_backend.errors import ShowcaseError
from neuron_backend.feedback import FeedbackLog, session_budget_left
from neuron_backend.runtime import Backend

from .api import shown
from .i18n import say, t

SAVED_CHATS_KEY = "showcase-saved-chats"
MAX_REMEMBERED_REPLIES = 64  # per session: replies whose settings a later mark can still find


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    if isinstance(content, dict):
        return str(content.get("text", ""))
    return "" if content is None else str(content)


def reply_key(answer: str) -> str:
    """The key of a reply's record in the session's reply records (chat_export.py reads them too)."""
    return hashlib.sha1(answer.strip().encode("utf-8", "replace")).hexdigest()[:16]


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


def marked_reply(history: list[dict], index) -> tuple[str, str, int]:
    """(prompt, reply, turn) of the reply at ``index``: a folded bubble (reasoning before the answer,
    a notice after it) counts as its answer."""
    index = index[0] if isinstance(index, (list, tuple)) else int(index)
    messages = list(history or [])

    def folded(i):
        return messages[i].get("role") != "assistant" or bool((messages[i].get("metadata") or {}).get("title"))

    forward = next((i for i in range(index, len(messages)) if not folded(i) or messages[i].get("role") == "user"),
                   None)
    if forward is None or messages[forward].get("role") == "user":  # a notice after the answer: look back
        forward = next((i for i in range(index, -1, -1) if not folded(i)), index)
    index = forward
    reply = _text(messages[index].get("content"))
    users = [i for i, m in enumerate(messages[:index]) if m.get("role") == "user"]
    if not users:
        return "", reply, 0
    return _text(messages[users[-1]].get("content")), reply, len(users)


def wire_feedback(backend: Backend, chatbot: gr.Chatbot, records: gr.State) -> FeedbackLog:
    """The like/dislike event of ``chatbot`` and the optional comment row under it."""
    log = FeedbackLog.for_settings(backend.settings)
    mark_id = gr.State(None)
    stored = gr.State(0)  # marks this session has stored
    with gr.Row(visible=False, elem_id="feedback-row") as row:
        comment = gr.Textbox(label=t("Comment on your mark (optional)"), lines=1, scale=4, elem_id="feedback-comment",
                             max_length=2000)
        save = gr.Button(t("Save comment"), size="sm", scale=1, elem_id="feedback-save")

    def mark_reply(history, remembered, count, evt: gr.LikeData):
        rating = {True: "up", "Like": "up", False: "down", "Dislike": "down"}.get(evt.liked)
        if rating is None:  # an unmark or another flag: nothing to store
            return None, gr.update(visible=False), "", gr.skip()
        try:
            session_budget_left(count or 0)
            prompt, reply, turn = marked_reply(history, evt.index)
            record = (remembered or {}).get(reply_key(reply), {})
            new_id = log.record(rating, prompt, reply, record.get("settings"), record.get("stats"), turn=turn)
        except ShowcaseError as exc:
            raise gr.Error(shown(exc)) from None
        backend.metrics.feedback.labels(rating).inc()
        gr.Info(say("Thanks: reply marked {mark}. Add a comment below if you like.",
                    mark="👍" if rating == "up" else "👎"))
        return new_id, gr.update(visible=True), "", (count or 0) + 1

    def save_comment(current_id, text):
        if current_id is None:
            return gr.skip(), gr.update(visible=False)
        try:
            log.comment(current_id, text)
        except ShowcaseError as exc:
            raise gr.Error(shown(exc)) from None
        gr.Info(say("Comment saved."))
        return None, gr.update(visible=False)

    chatbot.like(mark_reply, [chatbot, records, stored], [mark_id, row, comment, stored], api_visibility="private",
                 queue=False)
    for event in (save.click, comment.submit):
        event(save_comment, [mark_id, comment], [mark_id, row], api_visibility="private", queue=False)
    return log
