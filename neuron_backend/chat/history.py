"""Chat history in, chat history out: one normaliser for the UI and ``/chat``, and the export format.

``normalize_history`` takes what either side sends (Gradio chatbot messages with content as text
or a list of parts, the folded reasoning bubble, or the ``messages`` of an exported conversation)
and returns plain ``{"role", "content"}`` turns for the prompt. Limits are checked first, before
any text is copied or tokenized. Assistant text keeps its whitespace exactly, so the prompt stays
token-identical to the model's own chat template.

``export_document`` / ``load_document`` write and read the documented JSON export (docs/api.md, "Chat
export format"): version, model, system prompt, settings, and messages with reasoning and per-reply
stats kept apart from the answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from ..errors import InvalidRequestError
from ..messages import LANGUAGES, tr

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EXPORT_FORMAT = "trainium-showcase-chat"
EXPORT_VERSION = 1
REASONING_TITLE = tr("💭 Reasoning")  # the chatbot bubble that folds a reply's reasoning ("💭 Reasoning")
REASONING_TITLES = frozenset(REASONING_TITLE.text(language) for language in LANGUAGES)  # as a page of either shows it
NOTICE_PREFIX = "⚠"  # titles of notice bubbles (cut at the token limit, greedy with thinking)
SETTING_KEYS = ("thinking", "greedy", "temperature", "top_p", "top_k", "max_new_tokens", "seed")
_SETTING_TYPES = {"thinking": bool, "greedy": bool, "temperature": (int, float), "top_p": (int, float),
                  "top_k": int, "max_new_tokens": int, "seed": int}  # a loaded file's other values are ignored

_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all C0/C1 controls except \t and \n
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_ALLOWED = tr("a list of {{\"role\": \"user\" or \"assistant\", \"content\": text or a list of text parts}}, oldest "
              "first (an exported conversation's \"messages\" work as they are)")  # what a history may be


@dataclass(frozen=True)
class HistoryLimits:
    """How much history one request may carry (``--max-history-messages``, ``--max-history-chars``)."""

    messages: int = 200
    chars: int = 100_000
    message_chars: int = 20_000  # any one text (--max-prompt-chars)


def clean_text(what: str, value: object, limit: int) -> str:
    """Text with control characters removed; a clear error for non-text, invalid Unicode or too long."""
    if not isinstance(value, str):
        raise InvalidRequestError(tr("{what} must be text, got {kind}.", what=what, kind=type(value).__name__))
    if len(value) > limit:  # checked before any copy: a huge text costs nothing to refuse
        raise InvalidRequestError(tr("{what} is {length} characters; at most {limit} are allowed.",
                                     what=what, length=len(value), limit=limit))
    bad = _SURROGATE.search(value)
    if bad:
        raise InvalidRequestError(tr("{what} holds a lone surrogate ({char}) at character {at}, which is not valid "
                                     "Unicode; send UTF-8 text.", what=what, char=ascii(bad.group()), at=bad.start()))
    return _CONTROL_CHARS.sub("", value)


def strip_reasoning(content: str) -> str:
    """An assistant turn as it is fed back, exactly as Qwen3's own template treats it: everything up to
    the last ``</think>`` (old reasoning) goes, with the newlines after it; the rest stays as it is."""
    if THINK_CLOSE in content:
        return content.split(THINK_CLOSE)[-1].lstrip("\n")
    return content


def message_text(content: object, where: str) -> str:
    """Gradio message content (text, a text part, or a list of them) as one text."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str) and part.get("type", "text") == "text":
                texts.append(part["text"])
            else:
                kind = part.get("type", "?") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidRequestError(tr("{where} has a part of type {kind}; only text parts are accepted.",
                                             where=where, kind=repr(kind)))
        return "".join(texts)
    raise InvalidRequestError(tr("{where} must be text or a list of text parts, got {kind}.",
                                 where=where, kind=type(content).__name__))


def normalize_history(history: object, limits: HistoryLimits) -> tuple[dict, ...]:
    """Plain ``{"role", "content"}`` turns from UI or API history; folded bubbles are dropped."""
    if history is None:
        return ()
    if isinstance(history, Mapping) and "messages" in history:  # a whole exported conversation
        history = history["messages"]
    if not isinstance(history, (list, tuple)):
        raise InvalidRequestError(tr("The history must be {allowed}; got {kind}.",
                                     allowed=_ALLOWED, kind=type(history).__name__))
    if len(history) > limits.messages:
        raise InvalidRequestError(tr("The history has {count} messages; this server accepts at most {limit}. Send "
                                     "only the newest ones (old turns "
                                     "that do not fit the prompt are "
                                     "dropped anyway).", count=len(history), limit=limits.messages))
    turns, total = [], 0
    for i, item in enumerate(history):
        if not isinstance(item, Mapping) or item.get("role") not in ("user", "assistant"):
            raise InvalidRequestError(tr("History item {index} is not valid: it must be {allowed}.",
                                         index=i, allowed=_ALLOWED))
        if is_bubble(item):  # reasoning / notice bubbles are shown, never fed back
            continue
        text = message_text(item.get("content"), tr("The content of history item {index}", index=i))
        total += len(text)
        if total > limits.chars:
            raise InvalidRequestError(tr("The history holds more than {limit} characters; this server accepts at most "
                                         "{limit}. Send only the newest messages.", limit=limits.chars))
        text = clean_text(tr("The content of history item {index}", index=i), text, limits.message_chars)
        if item["role"] == "assistant":
            text = strip_reasoning(text)
        turns.append({"role": item["role"], "content": text})
    return tuple(turns)


def is_bubble(message: Mapping) -> bool:
    """A folded chatbot bubble (reasoning or a notice), not a turn of the conversation."""
    metadata = message.get("metadata")
    return isinstance(metadata, Mapping) and bool(metadata.get("title"))


def trim_to_limits(messages: Sequence[Mapping], limits: HistoryLimits) -> list:
    """The newest whole turns of a chatbot history within the limits (the UI sends these; the
    oldest would not fit the prompt anyway)."""
    kept, count, chars = [], 0, 0
    for message in reversed(messages):
        try:
            size = len(message_text(message.get("content"), ""))  # the error is never shown
        except InvalidRequestError:
            size = 0
        count, chars = count + 1, chars + size
        if count > limits.messages or chars > limits.chars:
            break
        kept.append(message)
    kept.reverse()
    while kept and (kept[0].get("role") != "user" or is_bubble(kept[0])) and len(kept) < len(messages):
        kept.pop(0)  # start at a user message: never half a turn
    return kept


# ----- export / import ----------------------------------------------------------------------------
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
