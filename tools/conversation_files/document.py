"""The conversation export document: ``export_document`` writes a chatbot history with its reasoning, notices,
settings and each reply's stats; ``load_document`` checks one read back. No Gradio here: the row under the chat is
``row.py``. The format: docs/api.md, "Chat history and the export format"."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

from neuron_backend.chat.text import (
    NOTICE_PREFIX,
    REASONING_TITLE,
    HistoryLimits,
    clean_text,
    is_bubble,
    message_text,
    normalize_history,
)
from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import LANGUAGES, tr

EXPORT_FORMAT = "trainium-showcase-chat"
EXPORT_VERSION = 1
REASONING_TITLES = frozenset(REASONING_TITLE.text(language) for language in LANGUAGES)  # as a page of either shows it
SETTING_KEYS = ("thinking", "greedy", "temperature", "top_p", "top_k", "max_new_tokens", "seed")
_SETTING_TYPES = {"thinking": bool, "greedy": bool, "temperature": (int, float), "top_p": (int, float),
                  "top_k": int, "max_new_tokens": int, "seed": int}  # a loaded file's other values are ignored


def export_document(messages: Sequence[Mapping], *, model: str, system_prompt: str | None, settings: Mapping,
                    stats_of: Callable[[str], Mapping | None] = lambda answer: None) -> dict:
    """The JSON export of a chatbot history: reasoning and notices kept apart, stats per reply.

    ``stats_of(answer)`` gives the stats the Chat tab kept for the reply with that answer text, or None.
    """
    out, reasoning, notices = [], None, []
    for m in messages:
        role = m.get("role")
        try:
            text = message_text(m.get("content"), "")  # the error is never shown
        except InvalidRequestError:
            continue
        title = (m.get("metadata") or {}).get("title") if isinstance(m.get("metadata"), Mapping) else None
        if title in REASONING_TITLES:
            reasoning = text
            continue
        if title:
            notices.append(f"{title.removeprefix(NOTICE_PREFIX).strip()}. {text}".strip())
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("notices", []).append(notices.pop())
            continue
        entry = {"role": role, "content": text}
        if role == "assistant":
            if reasoning is not None:
                entry["reasoning"] = reasoning
            stats = stats_of(text)
            if stats:
                entry["stats"] = dict(stats)
            if notices:
                entry["notices"], notices = notices, []
        reasoning = None
        out.append(entry)
    return {
        "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": model, "system_prompt": system_prompt or None,
        "settings": {k: settings.get(k) for k in SETTING_KEYS if k in settings},
        "messages": out,
    }


def load_document(data: object, limits: HistoryLimits) -> dict:
    """Check an exported conversation; return it with its messages as ``normalize_history`` keeps them
    (plus their reasoning, stats and notices, for showing)."""
    if not isinstance(data, Mapping) or data.get("format") != EXPORT_FORMAT:
        raise InvalidRequestError(tr("This file is not a conversation exported by this app (its \"format\" must be "
                                     "{format}).", format=repr(EXPORT_FORMAT)))
    if data.get("version") != EXPORT_VERSION:
        raise InvalidRequestError(tr("Conversation export version {version} is not supported; this app reads version "
                                     "{supported}.", version=repr(data.get("version")),
                                      supported=EXPORT_VERSION))
    messages = data.get("messages")
    normalize_history(messages, limits)  # every check of /chat, so what loads here also sends
    system = data.get("system_prompt")
    if system is not None:
        system = clean_text(tr("The system prompt"), system, limits.message_chars)
    settings = data.get("settings") if isinstance(data.get("settings"), Mapping) else {}
    settings = {k: v for k, v in settings.items() if k in _SETTING_TYPES and isinstance(v, _SETTING_TYPES[k])
                and not (isinstance(v, bool) and _SETTING_TYPES[k] is not bool)}
    kept = []
    for m in messages:
        if is_bubble(m):
            continue
        a_message = tr("A message")
        entry = {"role": m["role"], "content": clean_text(a_message, message_text(m.get("content"), a_message),
                                                          limits.message_chars)}
        if isinstance(m.get("reasoning"), str):
            entry["reasoning"] = clean_text(tr("A reply's reasoning"), m["reasoning"], limits.message_chars)
        if isinstance(m.get("notices"), list):
            entry["notices"] = [clean_text(tr("A notice"), n, 1000) for n in m["notices"]
                                if isinstance(n, str)][:4]
        if isinstance(m.get("stats"), Mapping):
            entry["stats"] = {str(k): v for k, v in m["stats"].items() if isinstance(v, (int, float, str, bool))
                              or v is None}
        kept.append(entry)
    return {"model": data.get("model"), "system_prompt": system,
            "settings": settings, "messages": kept}

