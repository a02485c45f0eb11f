"""The Chat tab's 👍/👎 row: the chatbot's thumbs mark a reply, and a comment box appears for an optional
comment on that mark (Gradio; the plug-in, ``plugin.py``, hands ``wire_feedback`` to the chat tab as an extra row).

The mark goes to ``tools.qa.feedback`` with the reply's settings and stats (remembered per reply in the
session when it finished, so only a reply this server produced in this session carries them; a reply
that a loaded conversation file brought carries none). A session
stores at most ``MAX_MARKS_PER_SESSION`` marks (counted in a ``gr.State``, which lives on the server: the
page cannot reset it short of opening a new session).
"""

from __future__ import annotations

import gradio as gr
from prometheus_client import Counter

from neuron_backend.errors import ShowcaseError
from neuron_backend.runtime import Backend
from ui.api import shown
from ui.chat_tab import ChatForm, produced_reply
from ui.i18n import say, t

from .feedback import FeedbackLog, session_budget_left


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    if isinstance(content, dict):
        return str(content.get("text", ""))
    return "" if content is None else str(content)


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


def _marks(metrics) -> Counter:
    """The marks counter in the Backend's registry (by rating: up, down)."""
    return Counter("showcase_feedback_marks", "Chat replies marked by users", ["rating"], registry=metrics.registry)


def wire_feedback(backend: Backend, form: ChatForm) -> FeedbackLog:
    """The like/dislike event of the form's chatbot and the optional comment row under it."""
    chatbot, records = form.chatbot, form.records
    log = FeedbackLog.for_settings(backend.settings)
    marks = backend.metrics.own("feedback", _marks)  # showcase_feedback_marks_total, beside the core's series
    mark_id = gr.State(None)
    marked = gr.State(None)  # the marked reply's text: the comment row goes when its chat goes
    stored = gr.State(0)  # marks this session has stored
    with gr.Row(visible=False, elem_id="feedback-row") as row:
        comment = gr.Textbox(label=t("Comment on your mark (optional)"), lines=1, scale=4, elem_id="feedback-comment",
                             max_length=2000)
        save = gr.Button(t("Save comment"), size="sm", scale=1, elem_id="feedback-save")

    def mark_reply(history, remembered, count, evt: gr.LikeData, request: gr.Request):
        rating = {True: "up", "Like": "up", False: "down", "Dislike": "down"}.get(evt.liked)
        if rating is None:  # an unmark or another flag: nothing to store
            return None, gr.update(visible=False), "", gr.skip(), None
        try:
            session_budget_left(count or 0)
            prompt, reply, turn = marked_reply(history, evt.index)
            record = produced_reply(remembered, reply)  # {} unless this server produced the reply here
            client = request.client.host if request is not None and request.client else None
            new_id = log.record(rating, prompt, reply, record.get("settings"), record.get("stats"), turn=turn,
                                client=client)
        except ShowcaseError as exc:
            raise gr.Error(shown(exc)) from None
        marks.labels(rating).inc()
        gr.Info(say("Thanks: reply marked {mark}. Add a comment below if you like.",
                    mark="👍" if rating == "up" else "👎"))
        return new_id, gr.update(visible=True), "", (count or 0) + 1, reply

    def save_comment(current_id, text):
        if current_id is None:
            return gr.skip(), gr.update(visible=False)
        try:
            log.comment(current_id, text)
        except ShowcaseError as exc:
            raise gr.Error(shown(exc)) from None
        gr.Info(say("Comment saved."))
        return None, gr.update(visible=False)

    def follow_chat(history, reply):
        """The comment row goes when the marked reply leaves the chat (New chat, another saved chat, Clear)."""
        if reply is None or any(m.get("role") == "assistant" and _text(m.get("content")) == reply
                                for m in history or []):
            return gr.skip(), gr.skip(), gr.skip()
        return None, None, gr.update(visible=False)

    chatbot.like(mark_reply, [chatbot, records, stored], [mark_id, row, comment, stored, marked],
                 api_visibility="private", queue=False)
    for event in (save.click, comment.submit):
        event(save_comment, [mark_id, comment], [mark_id, row], api_visibility="private", queue=False)
    chatbot.change(follow_chat, [chatbot, marked], [mark_id, marked, row], api_visibility="private", queue=False,
                   trigger_mode="always_last", show_progress="hidden")
    return log
