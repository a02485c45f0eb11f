"""The chat's text, no model needed: history in and out, request checks, the <think> splitter, and
the plain-data results (``ChatStats``, ``ChatUpdate``, ``PromptInfo``).

Everything a user types passes ``normalize_request``; streamed model text passes ``ThinkSplitter``. Formats
and rules: docs/api.md, "Chat history and the export format".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from ..errors import InvalidRequestError, real_number, true_or_false, whole_number
from ..messages import tr

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_TITLE = tr("💭 Reasoning")  # the chatbot bubble that folds a reply's reasoning ("💭 Reasoning")
NOTICE_PREFIX = "⚠"  # titles of notice bubbles (cut at the token limit, greedy with thinking)

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
    """Plain ``{"role", "content"}`` turns from UI or API history; folded bubbles are dropped (their
    text still counts toward ``limits.chars``, and each is one of ``limits.messages``)."""
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
        text = message_text(item.get("content"), tr("The content of history item {index}", index=i))
        total += len(text)  # folded bubbles too: never fed back, but carried and shown all the same
        if total > limits.chars:
            raise InvalidRequestError(tr("The history holds more than {limit} characters; this server accepts at most "
                                         "{limit}. Send only the newest messages.", limit=limits.chars))
        if is_bubble(item):  # reasoning / notice bubbles are shown, never fed back
            continue
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


# Qwen's recommended sampling per mode.
SAMPLING_DEFAULTS = {
    "thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    "chat": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
}
MIN_TEMPERATURE = 0.01  # below this, sampling overflows (1e-300 divides the logits to inf): use greedy
MAX_TOP_K = 1000
# Qwen3's model card, "Best Practices": its advice against greedy decoding in thinking mode.
GREEDY_THINKING_ADVICE = tr("Qwen advises against greedy decoding with thinking on: \"DO NOT use greedy decoding, as "
                            "it can lead to performance degradation and endless repetitions.\" Untick Greedy to "
                            "sample with its thinking defaults (temperature 0.6, top_p 0.95, top_k 20).")


@dataclass(frozen=True)
class ChatRequest:
    """One chat turn as the UI or the API sends it; ``ChatEngine.validate`` fills the defaults."""

    message: str
    history: object = ()  # {"role": "user"|"assistant", "content": text or parts}, oldest first (normalize_history)
    system_prompt: str | None = None
    thinking: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    greedy: bool = False
    seed: int | None = None


def normalize_request(request: ChatRequest | Mapping, limit: int, max_new_tokens: int,
                      allow_empty: bool = False, history_limits: HistoryLimits | None = None) -> ChatRequest:
    """Check a request (a ChatRequest or a dict of its fields); fill the sampling defaults of its mode.

    ``limit`` is the most characters of any one text; ``max_new_tokens`` the server's cap;
    ``history_limits`` the most history messages and characters (checked before anything is copied).
    """
    if isinstance(request, Mapping):
        names = [f.name for f in fields(ChatRequest)]
        unknown = sorted(set(request) - set(names))
        if unknown or "message" not in request:
            raise InvalidRequestError(tr("Chat request fields {fields} are not valid; allowed: {allowed} (message is "
                                         "required).", fields=unknown or ['message (missing)'],
                                          allowed=", ".join(names)))
        request = ChatRequest(**request)
    if not isinstance(request, ChatRequest):
        raise InvalidRequestError(tr("A chat request must be a ChatRequest or a dict of its fields."))
    limits = history_limits or HistoryLimits(message_chars=limit)
    history = normalize_history(request.history, HistoryLimits(limits.messages, limits.chars, limit))
    message = clean_text(tr("The message"), request.message, limit).strip()
    if not message and not allow_empty:
        raise InvalidRequestError(tr("The message is empty: type something to send."))
    system = clean_text(tr("The system prompt"), request.system_prompt or "", limit).strip() or None
    thinking, greedy = true_or_false("thinking", request.thinking), true_or_false("greedy", request.greedy)
    defaults = SAMPLING_DEFAULTS["thinking" if thinking else "chat"]
    return ChatRequest(
        message=message,
        history=history,
        system_prompt=system,
        thinking=thinking,
        temperature=_or_default(real_number, "temperature", request.temperature, defaults["temperature"],
                                MIN_TEMPERATURE, 2.0, hint=tr("For the most likely token every time, use greedy.")),
        top_p=_or_default(real_number, "top_p", request.top_p, defaults["top_p"], 0.0, 1.0, above=True),
        top_k=_or_default(whole_number, "top_k", request.top_k, defaults["top_k"], 0, MAX_TOP_K),
        max_new_tokens=_or_default(whole_number, "max_new_tokens", request.max_new_tokens, max_new_tokens, 1,
                                   max_new_tokens),
        greedy=greedy,
        seed=_or_default(whole_number, "seed", request.seed, None, 0, 2**32 - 1),
    )


class ThinkSplitter:
    """Split streamed text into reasoning (inside <think>...</think>) and answer; the deltas joined are exactly
    reasoning + answer. Only tags that mean something count (``tags=False``: none), and a tail that could begin
    a tag is held back until the next chunk decides. The rules: docs/api.md, "Reasoning and answer".
    """

    def __init__(self, in_reasoning: bool = False, tags: bool = True):
        self.in_reasoning = in_reasoning
        self._parts: dict[bool, list[str]] = {True: [], False: []}  # by "in reasoning"
        self._held = {True: "", False: ""}
        self._pending = ""
        self._tags = tags
        self._seen_block = in_reasoning  # a think block was opened (in the reply or the prompt)
        self._closed = False  # the think block ended: no more tags
        self._started = False  # answer text came first: a later <think> is text

    @property
    def reasoning(self) -> str:
        return "".join(self._parts[True])

    @property
    def answer(self) -> str:
        return "".join(self._parts[False])

    def _active_tags(self) -> tuple[str, ...]:
        if not self._tags or self._closed:
            return ()
        return (THINK_CLOSE,) if self.in_reasoning or self._seen_block else (THINK_OPEN, THINK_CLOSE)

    def feed(self, chunk: str) -> str:
        """Add a chunk; return the text it added to reasoning or answer (tags removed)."""
        text, self._pending, added = self._pending + chunk, "", []
        while text:
            tags = self._active_tags()
            found = [(text.find(tag), tag) for tag in tags if tag in text]
            if not found:
                keep = max((_partial_tag_length(text, tag) for tag in tags), default=0)
                added.append(self._emit(text[: len(text) - keep]))
                self._pending = text[len(text) - keep :]
                break
            index, tag = min(found)
            if tag == THINK_OPEN and (self._started or text[:index].strip()):  # not where a reply begins: text
                added.append(self._emit(text[: index + len(tag)]))
                text, self._closed = text[index + len(tag) :], True
                continue
            added.append(self._emit(text[:index]))
            text = text[index + len(tag) :]
            if tag == THINK_OPEN:
                self.in_reasoning = self._seen_block = True
            elif self.in_reasoning:
                self.in_reasoning, self._closed = False, True
            else:  # a close tag whose open tag was in the prompt: what came so far was reasoning
                self._parts[True] += self._parts[False]
                self._parts[False], self._held[False] = [], ""
                self._seen_block = self._closed = True
        return "".join(added)

    def finish(self) -> str:
        """Flush a held-back tail at the end of the stream (trailing whitespace is dropped)."""
        text, self._pending = self._pending, ""
        return self._emit(text)

    def _emit(self, text: str) -> str:
        part = self.in_reasoning
        text = self._held[part] + text
        if not self._parts[part]:
            text = text.lstrip()
        kept = text.rstrip()
        self._held[part] = text[len(kept):]
        if kept:
            self._parts[part].append(kept)
            self._started = self._started or not part
        return kept


def _partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def _or_default(check, name: str, value: object, default, *limits, **options):
    """``default`` for a field left out (None), else the checked value."""
    return default if value is None else check(name, value, *limits, **options)


@dataclass
class ChatStats:
    """What one reply cost; all plain data."""

    prompt_tokens: int  # real prompt tokens, before padding
    bucket: int  # the padded prompt length the prefill saw
    new_tokens: int
    time_to_first_token_s: float | None  # start of generate() to the first new token (includes prefill)
    tokens_per_s: float  # decode speed after the first token (0.0 with a single token)
    total_s: float
    compiled_graphs: int  # graphs compiled while this reply ran (0 once warmed up)
    dropped_turns: int
    context_length: int
    max_new_tokens: int  # after capping to the context
    stopped: bool  # cancelled by the user
    finish_reason: str  # "eos" | "length" | "stopped"
    seed: int | None = None  # the seed used for sampling (None when greedy, or sampled in a shared batch)
    batch_size: int = 1  # rows of the generate() call (a chat batch's N), padding rows included
    queued_s: float | None = None  # batched path: waiting for a batch to start (None on the single path)


@dataclass
class ChatUpdate:
    """One streamed step; reasoning and answer are cumulative, delta is the text new in this step."""

    reasoning: str
    answer: str
    delta: str
    done: bool
    stats: ChatStats | None = None
    dropped_turns: int = 0


@dataclass(frozen=True)
class PromptInfo:
    """What the context meter shows before sending."""

    prompt_tokens: int
    bucket: int | None  # None when the prompt does not fit any bucket
    dropped_turns: int
    largest_bucket: int
    context_length: int
    max_new_tokens: int  # the most new tokens a reply may have at this bucket
    fits: bool
    problem: str | None = None


@dataclass(frozen=True)
class Notice:
    """Something a reader of a reply should know: a short title and what to do about it.

    Both are messages (``neuron_backend.messages``): ``str(notice)`` is English (/chat's notices);
    the page shows them in its language.
    """

    title: str
    detail: str

    def __str__(self) -> str:
        return f"{self.title}. {self.detail}"


def reply_notices(update: ChatUpdate, request: ChatRequest | None = None,
                  server_max: int | None = None) -> list[Notice]:
    """Notices for a final update: cut at the token limit (and whether still reasoning), greedy with thinking.

    ``server_max``: the server's --max-new-tokens; a reply cut there cannot be made longer by raising the
    setting, so the notice says to ask for the rest in a new message instead."""
    notices = []
    stats = update.stats
    if stats is not None and stats.finish_reason == "length":
        where = tr("while still reasoning: no answer yet" if update.reasoning and not update.answer
                    else "before the reply was finished")
        thinking = request is not None and request.thinking
        if server_max is not None and stats.max_new_tokens >= server_max:
            fix = tr("This is the server's longest reply (--max-new-tokens {limit}): ask for the rest in a new "
                     "message, or turn thinking off." if thinking else
                     "This is the server's longest reply (--max-new-tokens {limit}): ask for the rest in a new "
                     "message.", limit=server_max)
        else:
            fix = tr("Raise max_new_tokens for a longer reply (reasoning often takes many more tokens than the "
                     "answer), or turn thinking off." if thinking else "Raise max_new_tokens for a longer reply.")
        notices.append(Notice(tr("Stopped at the limit of {limit} new tokens, {where}",
                                 limit=stats.max_new_tokens, where=where), fix))
    if request is not None and request.greedy and request.thinking:
        notices.append(Notice(tr("Greedy decoding with thinking on"), GREEDY_THINKING_ADVICE))
    return notices
