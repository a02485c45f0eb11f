"""The text side of the chat engine, no model needed: request checks, the <think> splitter, and
the plain-data results (``ChatStats``, ``ChatUpdate``, ``PromptInfo``).

Everything a user types passes ``normalize_request``; streamed model text passes ``ThinkSplitter``.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from ..errors import InvalidRequestError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Qwen's recommended sampling per mode.
SAMPLING_DEFAULTS = {
    "thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    "chat": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
}
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all C0/C1 controls except \t and \n
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)\s*", re.DOTALL)


@dataclass(frozen=True)
class ChatRequest:
    """One chat turn as the UI or the API sends it; ``ChatEngine.validate`` fills the defaults."""

    message: str
    history: tuple[dict, ...] | list[dict] = ()  # {"role": "user"|"assistant", "content": str}, oldest first
    system_prompt: str | None = None
    thinking: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    greedy: bool = False
    seed: int | None = None


def normalize_request(request: ChatRequest | Mapping, limit: int, max_new_tokens: int,
                      allow_empty: bool = False) -> ChatRequest:
    """Check a request (a ChatRequest or a dict of its fields); fill the sampling defaults of its mode.

    ``limit`` is the most characters of any one text; ``max_new_tokens`` the server's cap.
    """
    if isinstance(request, Mapping):
        names = [f.name for f in fields(ChatRequest)]
        unknown = sorted(set(request) - set(names))
        if unknown or "message" not in request:
            raise InvalidRequestError(f"Chat request fields {unknown or ['message (missing)']} are not valid; "
                                      f"allowed: {', '.join(names)} (message is required).")
        request = ChatRequest(**request)
    if not isinstance(request, ChatRequest):
        raise InvalidRequestError("A chat request must be a ChatRequest or a dict of its fields.")
    message = _clean_text("The message", request.message, limit).strip()
    if not message and not allow_empty:
        raise InvalidRequestError("The message is empty: type something to send.")
    system = _clean_text("The system prompt", request.system_prompt or "", limit).strip() or None
    thinking, greedy = _flag("thinking", request.thinking), _flag("greedy", request.greedy)
    defaults = SAMPLING_DEFAULTS["thinking" if thinking else "chat"]
    return ChatRequest(
        message=message,
        history=_clean_history(request.history, limit),
        system_prompt=system,
        thinking=thinking,
        temperature=_real("temperature", request.temperature, defaults["temperature"], 2.0),
        top_p=_real("top_p", request.top_p, defaults["top_p"], 1.0),
        top_k=_whole("top_k", request.top_k, defaults["top_k"], 0, None),
        max_new_tokens=_whole("max_new_tokens", request.max_new_tokens, max_new_tokens, 1, max_new_tokens),
        greedy=greedy,
        seed=_whole("seed", request.seed, None, 0, 2**32 - 1),
    )


class ThinkSplitter:
    """Split streamed text into reasoning (inside <think>...</think>) and answer.

    Tags may arrive split across chunks ("<th" + "ink>"): a tail that could begin a tag is held
    back until the next chunk decides. A ``</think>`` with no ``<think>`` before it (a template that
    opens the block in the prompt) turns everything so far into reasoning.
    """

    def __init__(self, in_reasoning: bool = False):
        self.in_reasoning = in_reasoning
        self._reasoning, self._answer, self._pending = [], [], ""
        self._seen_block = in_reasoning

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning).strip()

    @property
    def answer(self) -> str:
        return "".join(self._answer).strip()

    def feed(self, chunk: str) -> str:
        """Add a chunk; return the text it added to reasoning or answer (tags removed)."""
        text, self._pending, added = self._pending + chunk, "", []
        while text:
            tags = (THINK_CLOSE,) if self.in_reasoning else (THINK_OPEN, THINK_CLOSE)
            found = [(text.find(tag), tag) for tag in tags if tag in text]
            if not found:
                keep = max(_partial_tag_length(text, tag) for tag in tags)
                added.append(self._emit(text[: len(text) - keep]))
                self._pending = text[len(text) - keep :]
                break
            index, tag = min(found)
            added.append(self._emit(text[:index]))
            text = text[index + len(tag) :]
            if tag == THINK_OPEN:
                self.in_reasoning = self._seen_block = True
            elif self.in_reasoning:
                self.in_reasoning = False
            elif not self._seen_block:  # a close tag whose open tag was in the prompt
                self._reasoning += self._answer
                self._answer, self._seen_block = [], True
        return "".join(added)

    def finish(self) -> str:
        """Flush a held-back tail at the end of the stream."""
        text, self._pending = self._pending, ""
        return self._emit(text)

    def _emit(self, text: str) -> str:
        (self._reasoning if self.in_reasoning else self._answer).append(text)
        return text


def _partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


def strip_reasoning(content: str) -> str:
    """An assistant turn without its think block(s), as it is fed back to the model."""
    if THINK_CLOSE in content and THINK_OPEN not in content.split(THINK_CLOSE)[0]:
        content = content.split(THINK_CLOSE, 1)[1]  # the open tag was in the prompt, not the reply
    return _THINK_BLOCK.sub("", content).strip()


def _clean_text(what: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be text, got {type(value).__name__}.")
    value = _CONTROL_CHARS.sub("", value)
    if len(value) > limit:
        raise InvalidRequestError(f"{what} is {len(value)} characters; at most {limit} are allowed.")
    return value


def _clean_history(history: object, limit: int) -> tuple[dict, ...]:
    allowed = 'a list of {"role": "user" or "assistant", "content": text}, oldest first'
    if history is None:
        return ()
    if not isinstance(history, (list, tuple)):
        raise InvalidRequestError(f"The history must be {allowed}; got {type(history).__name__}.")
    cleaned = []
    for i, item in enumerate(history):
        if not isinstance(item, Mapping) or item.get("role") not in ("user", "assistant"):
            raise InvalidRequestError(f"History item {i} is not valid: it must be {allowed}.")
        content = _clean_text(f"The content of history item {i}", item.get("content"), limit)
        if item["role"] == "assistant":
            content = strip_reasoning(content)
        cleaned.append({"role": item["role"], "content": content})
    return tuple(cleaned)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be true or false, got {_shown(value)}.")
    return value


def _real(name: str, value: object, default: float, high: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= high:
        raise InvalidRequestError(f"{name} must be a number above 0 and at most {high:g}, got {_shown(value)}.")
    return float(value)


def _whole(name: str, value: object, default: int | None, low: int, high: int | None) -> int | None:
    if value is None:
        return default
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        allowed = f"a whole number from {low} to {high}" if high is not None else f"a whole number of {low} or more"
        raise InvalidRequestError(f"{name} must be {allowed}, got {_shown(value)}.")
    return int(value)


def _shown(value: object) -> str:
    text = repr(value)
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
