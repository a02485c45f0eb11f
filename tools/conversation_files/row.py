"""The Chat tab's Export JSON / Export Markdown / Load JSON row (Gradio; the plug-in, ``plugin.py``, hands
``wire_conversation_files`` to the tab as a chat extra): the chat as it is shown, with the controls' settings and
each reply's stats, written to a served file (``document.py``'s schema, or ``markdown.py``'s Markdown); a loaded
file checked (``read_conversation``) and put back in the chat and the controls.

A loaded reply's stats are kept in the session's reply records for Export, marked loaded: a 👍/👎 mark never
stores them (``ui.chat_tab.produced_reply``).
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from neuron_backend.chat.text import NOTICE_PREFIX, REASONING_TITLE, HistoryLimits
from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import tr
from neuron_backend.runtime import Backend
from ui.api import refusals_as_toast, user_errors
from ui.chat_tab import ChatForm, history_limits, produced_reply, reply_key
from ui.i18n import localized, t

from .document import export_document, load_document
from .markdown import conversation_markdown

MAX_FILE_OVERHEAD = 1_000_000  # bytes a loaded file may hold beyond its history's character limit


def conversation_document(backend: Backend, history, system, think, temp, p, k, max_tokens, is_greedy, seed,
                          records) -> dict:
    """The export of what the Chat tab shows, with the controls' settings and each reply's stats."""
    settings = backend.settings
    model = settings.chat_model + (" (demo model, random weights)" if settings.demo else "")
    whole = {"top_k": k, "max_new_tokens": max_tokens, "seed": seed}
    controls = {"thinking": bool(think), "greedy": bool(is_greedy), "temperature": temp, "top_p": p,
                **{key: None if value is None else int(value) for key, value in whole.items()}}
    records = records or {}

    def stats_of(answer: str):
        return (records.get(reply_key(answer)) or {}).get("stats")

    return export_document(history or [], model=model, system_prompt=system or None, settings=controls,
                           stats_of=stats_of)


def shown_messages(document: dict) -> list[dict]:
    """Chatbot messages of a loaded conversation: reasoning folded above each answer (titled in the page's
    language), notices below (as the file has them)."""
    messages = []
    for m in document["messages"]:
        if m.get("reasoning"):
            messages.append({"role": "assistant", "content": m["reasoning"],
                             "metadata": {"title": localized(REASONING_TITLE), "status": "done"}})
        messages.append({"role": m["role"], "content": m["content"]})
        for notice in m.get("notices") or []:
            title, _, detail = notice.partition(". ")
            messages.append({"role": "assistant", "content": detail,
                             "metadata": {"title": f"{NOTICE_PREFIX} {title}", "status": "done"}})
    return messages


def read_conversation(path: str, limits: HistoryLimits) -> dict:
    """A conversation file, checked: size, JSON, the export schema and the history limits."""
    limit = 4 * limits.chars + MAX_FILE_OVERHEAD  # JSON escapes can take several bytes per character
    size = Path(path).stat().st_size
    if size > limit:
        raise InvalidRequestError(tr("The file is {size} bytes; a conversation file may be at most {limit} bytes.",
                                     size=size, limit=limit))
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidRequestError(tr("The file is not a JSON conversation export ({error}).",
                                     error=_unreadable(exc))) from None
    return load_document(data, limits)


def _unreadable(exc: Exception) -> str:
    """Why a file did not read as JSON, in plain words (not Python's exception or its message)."""
    if isinstance(exc, UnicodeDecodeError):
        return tr("it is not UTF-8 text")
    if isinstance(exc, RecursionError):
        return tr("its JSON is nested deeper than an export ever is")
    if isinstance(exc, json.JSONDecodeError):
        return tr("it is not valid JSON")
    return tr("it holds a number of over 4300 digits")  # json.loads' other ValueError: int() refuses those


def wire_conversation_files(backend: Backend, form: ChatForm):
    """Export JSON / Export Markdown / Load JSON under the chat, wired to ``form`` (its controls: system prompt,
    thinking, temperature, top_p, top_k, max new tokens, greedy, seed). Returns the load event, which
    ``form.after_load`` has followed (a loaded conversation clears the stats line and the context meter)."""
    limits = history_limits(backend.settings)
    chat, controls, reply_records = form.chat, list(form.controls), form.records
    with gr.Row():
        export_json_btn = gr.Button(t("Export JSON"), size="sm", elem_id="export-json")
        export_md_btn = gr.Button(t("Export Markdown"), size="sm", elem_id="export-md")
        load_btn = gr.UploadButton(t("Load JSON"), size="sm", file_types=[".json"], elem_id="load-json")
    # Shown once there is a file to download: an empty drop zone under the chat said nothing.
    export_file = gr.File(label=t("Conversation export"), height=90, elem_id="export-file", visible=False)

    # A full or read-only cache root refuses the file (StorageError): one toast that says what to do.
    @refusals_as_toast(outputs=1)
    def export_json(history, *values):
        document = conversation_document(backend, history, *values)
        path = backend.exports.write(json.dumps(document, ensure_ascii=False, indent=1), ".json", "conversation")
        return gr.update(value=str(path), visible=True)

    @refusals_as_toast(outputs=1)
    def export_markdown(history, *values):
        document = conversation_document(backend, history, *values)
        return gr.update(value=str(backend.exports.write(conversation_markdown(document), ".md", "conversation")),
                         visible=True)

    @user_errors
    def load_conversation(file, records):
        document = read_conversation(file if isinstance(file, str) else file.name, limits)
        settings = document["settings"]
        records = dict(records or {})
        for m in document["messages"]:  # kept for Export, marked loaded: a 👍/👎 never stores the file's stats
            if m["role"] == "assistant" and m.get("stats") and not produced_reply(records, m["content"]):
                records[reply_key(m["content"])] = {"settings": settings, "stats": m["stats"], "loaded": True}
        ranges = {"temperature": (0.05, 2.0), "top_p": (0.05, 1.0), "top_k": (0, 100),
                  "max_new_tokens": (1, backend.settings.max_new_tokens), "seed": (-1, 2**32 - 1)}
        values = [document["system_prompt"] or ""]
        for key in ("thinking", "temperature", "top_p", "top_k", "max_new_tokens", "greedy", "seed"):
            value = settings.get(key)
            if value is not None and key in ranges:  # the sliders' ranges
                value = min(max(value, ranges[key][0]), ranges[key][1])
            values.append(-1 if key == "seed" and value is None else gr.skip() if value is None else value)
        return [shown_messages(document), *values, records]

    inputs = [chat.chatbot, *controls, reply_records]
    export_json_btn.click(export_json, inputs, export_file, api_visibility="private")
    export_md_btn.click(export_markdown, inputs, export_file, api_visibility="private")
    # chatbot_value: Gradio's way to set the chat from outside (it syncs ChatInterface's own state)
    loaded = load_btn.upload(load_conversation, [load_btn, reply_records],
                             [chat.chatbot_value, *controls, reply_records], api_visibility="private")
    form.after_load(loaded)
    return loaded
