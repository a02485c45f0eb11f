"""The text side of the chat engine, no model needed: request checks, the <think> splitter, and
the plain-data results (``ChatStats``, ``ChatUpdate``, ``PromptInfo``).

Everything a user types passes ``normalize_request``; streamed model text passes ``ThinkSplitter``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields

from ..errors import InvalidRequestError
from ..messages import tr
from .history import THINK_CLOSE, THINK_OPEN, HistoryLimits, clean_text, normalize_history, strip_reasoning

__all__ = ["THINK_CLOSE", "THINK_OPEN", "ChatRequest", "ChatStats", "ChatUpdate", "HistoryLimits", "Notice",
           "PromptInfo", "ThinkSplitter", "normalize_request", "reply_notices", "strip_reasoning"]
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
    history: object = ()  # {"role": "user"|"assistant", "content": text or parts}, oldest first (history.py)
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
    thinking, greedy = _flag("thinking", request.thinking), _flag("greedy", request.greedy)
    defaults = SAMPLING_DEFAULTS["thinking" if thinking else "chat"]
    return ChatRequest(
        message=message,
        history=history,
        system_prompt=system,
        thinking=thinking,
        temperature=_real("temperature", request.temperature, defaults["temperature"], 2.0, MIN_TEMPERATURE),
        top_p=_real("top_p", request.top_p, defaults["top_p"], 1.0),
        top_k=_whole("top_k", request.top_k, defaults["top_k"], 0, MAX_TOP_K),
        max_new_tokens=_whole("max_new_tokens", request.max_new_tokens, max_new_tokens, 1, max_new_tokens),
        greedy=greedy,
        seed=_whole("seed", request.seed, None, 0, 2**32 - 1),
    )


class ThinkSplitter:
    """Split streamed text into reasoning (inside <think>...</think>) and answer.

    Think tags count only where they mean something. With ``tags=False`` (thinking off: the
    template closed an empty think block in the prompt) every tag the model writes is answer text.
    With tags, only a ``<think>`` that opens the reply starts the reasoning and the first
    ``</think>`` ends it; later tags, and every tag after a literal ``<think>``, are answer text.
    A ``</think>`` with no ``<think>`` before it (a template that opens the block in the prompt)
    turns everything so far into reasoning.
    Tags may arrive split across chunks ("<th" + "ink>"): a tail that could begin a tag is held
    back until the next chunk decides.

    Whitespace: each part drops its leading whitespace and holds trailing whitespace back until more
    text follows, so the deltas joined are exactly reasoning + answer (no stray leading space).
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


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequestError(tr("{name} must be true or false, got {value}.", name=name, value=_shown(value)))
    return value


def _real(name: str, value: object, default: float, high: float, low: float | None = None) -> float:
    if value is None:
        return default
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    try:
        number = float(value) if ok else None
    except OverflowError:  # an integer too large for a float
        number = None
    if number is None or not ((low is None and 0 < number) or (low is not None and low <= number)) or number > high:
        if low is not None:
            raise InvalidRequestError(tr("{name} must be a number from {low} to {high} (for the most likely token "
                                         "every time, use greedy), got "
                                         "{value}.", name=name, low=f"{low:g}", high=f"{high:g}",
                                          value=_shown(value)))
        raise InvalidRequestError(tr("{name} must be a number above 0 and at most {high}, got {value}.",
                                     name=name, high=f"{high:g}", value=_shown(value)))
    return number


def _whole(name: str, value: object, default: int | None, low: int, high: int | None) -> int | None:
    if value is None:
        return default
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        if high is not None:
            raise InvalidRequestError(tr("{name} must be a whole number from {low} to {high}, got {value}.",
                                         name=name, low=low, high=high, value=_shown(value)))
        raise InvalidRequestError(tr("{name} must be a whole number of {low} or more, got {value}.",
                                     name=name, low=low, value=_shown(value)))
    return int(value)


def _shown(value: object) -> str:
    """A short repr of a refused value (a message for a huge integer)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**40:
        return tr("a whole number of about {digits} digits",
                  digits=int(value.bit_length() * 0.30103) + 1)  # str() fails past 4300
    if isinstance(value, str) and len(value) > 40:
        value = value[:37]
    try:
        text = repr(value)
    except ValueError:
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


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
    batch_size: int = 1  # rows of the generate() call (--chat-batch), padding rows included
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


def reply_notices(update: ChatUpdate, request: ChatRequest | None = None) -> list[Notice]:
    """Notices for a final update: cut at the token limit (and whether still reasoning), greedy with thinking."""
    notices = []
    stats = update.stats
    if stats is not None and stats.finish_reason == "length":
        where = tr("while still reasoning: no answer yet" if update.reasoning and not update.answer
                    else "before the reply was finished")
        fix = tr("Raise max_new_tokens for a longer reply (reasoning often takes many more tokens than the answer), "
                 "or turn thinking off." if request is not None and request.thinking
                  else "Raise max_new_tokens for a longer reply.")
        notices.append(Notice(tr("Stopped at the limit of {limit} new tokens, {where}",
                                 limit=stats.max_new_tokens, where=where), fix))
    if request is not None and request.greedy and request.thinking:
        notices.append(Notice(tr("Greedy decoding with thinking on"), GREEDY_THINKING_ADVICE))
    return notices
