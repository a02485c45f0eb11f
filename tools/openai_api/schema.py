"""What /v1 requests may carry and how its answers read: OpenAI's fields checked, backend errors in OpenAI's
error schema, and a reply's text with its stop sequences (plain data: no server, no model).

Fields this server cannot honour are refused with 400 unless they hold their neutral value (a
``frequency_penalty`` of 0, ``logprobs`` false, ...), so a client that sends its defaults is served and
one that asks for more is told what is supported. Messages here are for API clients: English, like
ui/api.py's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neuron_backend.chat.text import ChatRequest, ChatStats, ChatUpdate, message_text
from neuron_backend.errors import (
    BusyError,
    EngineUnavailableError,
    InvalidRequestError,
    ShapeFailedError,
    ShapeNotReadyError,
    ShowcaseError,
)
from neuron_backend.image.engine import ImageRequest
from neuron_backend.runtime import Backend
from neuron_backend.shapes import shape_keys
from ui.api import SEED_MAX

MAX_STOPS = 4  # stop sequences per request, as OpenAI allows
MAX_STOP_CHARS = 256  # characters of one stop sequence (a stop is a few tokens; OpenAI's are short too)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable",
               507: "server_error"}
# OpenAI fields this server cannot honour, accepted only at their neutral values (None is always fine).
CHAT_NEUTRAL = {"user": None, "metadata": None, "store": None, "service_tier": None, "parallel_tool_calls": None,
                "frequency_penalty": (0,), "presence_penalty": (0,), "logprobs": (False,), "top_logprobs": (0,),
                "tools": ([],), "tool_choice": ("none", "auto"), "logit_bias": ({},),
                "response_format": ({"type": "text"},)}
CHAT_FIELDS = ("model", "messages", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "seed",
               "stop", "n", "stream", "stream_options", "chat_template_kwargs")
IMAGE_NEUTRAL = {"user": None, "quality": ("auto", "standard"), "style": None, "output_format": ("png",),
                 "background": ("auto",), "moderation": ("auto",)}
IMAGE_FIELDS = ("model", "prompt", "n", "size", "response_format", "seed", "steps", "guidance")


class ApiError(Exception):
    """A /v1 refusal: HTTP status, message, and OpenAI's ``param`` and ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.retry_after = status, message, param, code, retry_after

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "invalid_request_error")

    def body(self) -> dict:
        """OpenAI's error object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def refusal(backend: Backend, engine: str, exc: ShowcaseError) -> ApiError:
    """The HTTP answer to a backend error: 400, 429, or 503 (with the warm-up ETA as Retry-After)."""
    message = str(exc)
    if isinstance(exc, ShapeNotReadyError):
        return ApiError(503, message, code="shape_not_ready", retry_after=_whole_s(
            backend.runner.eta_until(engine, exc.shape, planned=True)))
    if isinstance(exc, EngineUnavailableError):
        loading = backend.engine_states().get(engine) == "loading"
        first = shape_keys(backend.settings, engine)[0].label
        eta = backend.runner.eta_until(engine, first, planned=True) if loading else None
        return ApiError(503, message, code="engine_loading" if loading else "engine_unavailable",
                        retry_after=_whole_s(eta))
    if isinstance(exc, ShapeFailedError):
        return ApiError(503, message, code="shape_failed")
    if isinstance(exc, BusyError):
        return ApiError(429, message, code="queue_full")
    return ApiError(400, message, code="invalid_value" if isinstance(exc, InvalidRequestError) else None)


def _whole_s(eta: float | None) -> int | None:
    return None if eta is None else max(1, math.ceil(eta))


# ----- what a request may carry -------------------------------------------------------------------
def _check_fields(body: Mapping, known: tuple[str, ...], neutral: Mapping) -> None:
    for name, value in body.items():
        if name in known or value is None:
            continue
        if name not in neutral:
            raise ApiError(400, f"{name} is not supported here; supported fields: {', '.join(known)}.", name,
                           "unsupported_parameter")
        allowed = neutral[name]
        if allowed is not None and not any(value == a and isinstance(value, bool) == isinstance(a, bool)
                                           for a in allowed):
            shown = " or ".join(json.dumps(a) for a in allowed)
            raise ApiError(400, f"{name} is accepted only as {shown} (or left out) here.", name,
                           "unsupported_value")


def _whole(body: Mapping, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"{name} must be a whole number from {low} to {high}, got {json.dumps(value)[:40]}.",
                       name, "invalid_value")
    return value


def _model(body: Mapping, names: tuple[str, ...]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, f"model is required; this server serves: {', '.join(names)}.", "model", "missing_model")
    if model not in names:
        raise ApiError(404, f"The model {model!r} is not served here; use one of: {', '.join(names)}.", "model",
                       "model_not_found")
    return model


@dataclass(frozen=True)
class ChatCall:
    """A /v1 chat request as the backend takes it, and how to answer it."""

    request: ChatRequest
    model: str
    stream: bool = False
    include_usage: bool = False
    stops: tuple[str, ...] = ()


def chat_call(body: Mapping, backend: Backend) -> ChatCall:
    """Check a /v1/chat/completions body; the engine's own checks (history, sampling ranges) follow."""
    settings = backend.settings
    _check_fields(body, CHAT_FIELDS, CHAT_NEUTRAL)
    model = _model(body, model_names(backend, "chat"))
    if body.get("n") is not None and (type(body["n"]) is not int or body["n"] != 1):  # not 1.0, not true
        raise ApiError(400, f"n must be the whole number 1, got {json.dumps(body['n'])[:40]}: one reply per request "
                       "(send several requests for more).", "n", "invalid_value")
    stream = body.get("stream") or False
    options = body.get("stream_options") or {}
    if not isinstance(stream, bool) or not isinstance(options, Mapping) or set(options) - {"include_usage"}:
        raise ApiError(400, "stream must be true or false, stream_options {\"include_usage\": true or false}.",
                       "stream", "invalid_value")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping) or set(kwargs) - {"enable_thinking"} \
            or not isinstance(kwargs.get("enable_thinking", False), bool):
        raise ApiError(400, "chat_template_kwargs takes only {\"enable_thinking\": true or false}.",
                       "chat_template_kwargs", "invalid_value")
    limit = settings.max_new_tokens
    max_new = _whole(body, "max_completion_tokens", 1, limit) or _whole(body, "max_tokens", 1, limit)
    system, history, message = _conversation(body.get("messages"))
    temperature = body.get("temperature")
    greedy = temperature == 0 and not isinstance(temperature, bool)  # OpenAI's 0: always the likeliest token
    request = ChatRequest(message=message, history=history, system_prompt=system,
                          thinking=kwargs.get("enable_thinking", False),
                          temperature=None if greedy else temperature, top_p=body.get("top_p"),
                          top_k=body.get("top_k"), max_new_tokens=max_new, greedy=greedy, seed=body.get("seed"))
    return ChatCall(request, model, stream, bool(options.get("include_usage")), _stops(body.get("stop")))


def _conversation(messages: object) -> tuple[str | None, list[dict], str]:
    """(system prompt, history, last user message) of OpenAI ``messages``."""
    roles = ("system", "developer", "user", "assistant")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, Mapping) and m.get("role") in roles for m in messages):
        raise ApiError(400, "messages must be a non-empty list of {\"role\": \"system\", \"user\" or \"assistant\", "
                       "\"content\": text or text parts}, oldest first.", "messages", "invalid_value")
    systems = 0
    while systems < len(messages) and messages[systems]["role"] in ("system", "developer"):
        systems += 1
    rest = messages[systems:]
    if not rest or rest[-1]["role"] != "user" or any(m["role"] in ("system", "developer") for m in rest):
        raise ApiError(400, "messages must be system messages first (if any), then user and assistant turns ending "
                       "with a user message.", "messages", "invalid_value")
    system = "\n\n".join(message_text(m.get("content"), f"messages[{i}].content")
                         for i, m in enumerate(messages[:systems])) or None
    history = [{"role": m["role"], "content": m.get("content")} for m in rest[:-1]]
    return system, history, message_text(rest[-1].get("content"), f"messages[{len(messages) - 1}].content")


def _stops(stop: object) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    allowed = f"a text or a list of up to {MAX_STOPS} non-empty texts of at most {MAX_STOP_CHARS} characters each"
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        given = f"a list of {len(stops)}" if isinstance(stops, list) and len(stops) > MAX_STOPS else "not that"
        raise ApiError(400, f"stop must be {allowed}; got {given}.", "stop", "invalid_value")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise ApiError(400, f"stop must be {allowed}; one has {longest} characters.", "stop", "invalid_value")
    return tuple(stops)


@dataclass(frozen=True)
class ImageCall:
    """A /v1 image request as the backend takes it, and how to answer it."""

    request: ImageRequest
    model: str
    response_format: str = "b64_json"


def image_call(body: Mapping, backend: Backend, fields: tuple[str, ...] = IMAGE_FIELDS) -> ImageCall:
    """Check a /v1/images/generations body (``fields``: those the route takes): a precompiled size only (the
    engine checks the rest again)."""
    s = backend.settings
    _check_fields(body, fields, IMAGE_NEUTRAL)
    model = _model(body, model_names(backend, "image"))
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(400, "prompt is required: the text of what to draw.", "prompt", "invalid_value")
    sizes = [size.label for size in s.sizes]
    size = body.get("size") or sizes[0]
    if size not in sizes:
        raise ApiError(400, f"size {json.dumps(size)[:40]} is not served here (each size is compiled ahead of "
                       f"time); allowed sizes: {', '.join(sizes)}.", "size", "unsupported_size")
    form = body.get("response_format") or "b64_json"
    if form not in ("b64_json", "url"):
        raise ApiError(400, "response_format must be \"b64_json\" or \"url\".", "response_format", "invalid_value")
    request = ImageRequest(prompt=prompt, size=size, steps=_whole(body, "steps", 1, s.max_steps),
                           seed=_whole(body, "seed", 0, SEED_MAX), guidance=body.get("guidance"),
                           count=_whole(body, "n", 1, s.max_images_per_run) or 1)
    return ImageCall(request, model, form)


def model_names(backend: Backend, engine: str) -> tuple[str, ...]:
    """The names a request may give for an engine's model: its model id and the engine's name. A local model
    folder is named by its folder's name: /v1/models never shows a server path."""
    s = backend.settings
    model = s.chat_model if engine == "chat" else s.image_model
    local = model.startswith(("/", ".", "~")) or "\\" in model or Path(model).is_absolute()
    return (Path(model).name or model if local else model, engine)


# ----- chat: the reply's text as OpenAI gives it ----------------------------------------------------
class StopScan:
    """The answer up to the first stop sequence to complete, released as it streams: a tail that could begin a
    stop sequence is held back until the next text decides.

    Each character of the answer is looked at once per stop sequence (a Knuth-Morris-Pratt matcher that keeps
    its state between updates), so the work is linear in the reply whatever the stops are.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.sent, self.hit = stops, 0, False
        self._matchers = [_Matcher(stop) for stop in stops]
        self._scanned = 0  # characters of the answer the matchers have seen
        self._end: int | None = None  # where the answer stops (the first stop sequence's start), once found

    def feed(self, answer: str, final: bool = False) -> str:
        """The part of the cumulative ``answer`` that is new and safe to send (``final``: all of it)."""
        if self.hit or len(answer) < self.sent:
            return ""
        for at in range(self._scanned, len(answer)):
            char = answer[at]
            done = [len(matcher.pattern) for matcher in self._matchers if matcher.feed(char)]
            if done:  # the stops completed by this character: the reply ends where the longest begins
                self._end = at + 1 - max(done)
                break
        self._scanned = len(answer)
        if self._end is not None:
            self.hit, end = True, self._end
        elif final:
            end = len(answer)
        else:
            end = len(answer) - max((matcher.matched for matcher in self._matchers), default=0)
        new, self.sent = answer[self.sent:end], max(self.sent, end)
        return new


class _Matcher:
    """Knuth-Morris-Pratt over a stream: ``matched`` is the longest tail of the text so far that begins ``pattern``."""

    def __init__(self, pattern: str):
        self.pattern, self.matched = pattern, 0
        self._fallback = [0] * len(pattern)  # the longest proper prefix of pattern[:i + 1] that is also its suffix
        k = 0
        for i in range(1, len(pattern)):
            while k and pattern[i] != pattern[k]:
                k = self._fallback[k - 1]
            if pattern[i] == pattern[k]:
                k += 1
            self._fallback[i] = k

    def feed(self, char: str) -> bool:
        """Take one more character; True when the pattern ends with it."""
        k = self.matched
        while k and char != self.pattern[k]:
            k = self._fallback[k - 1]
        if char == self.pattern[k]:
            k += 1
        if k == len(self.pattern):
            self.matched = self._fallback[k - 1]
            return True
        self.matched = k
        return False


@dataclass
class ReplyText:
    """A reply's reasoning and answer as sent so far, from the engine's cumulative updates."""

    stops: StopScan
    reasoning: str = ""
    answer: str = ""
    stats: ChatStats | None = None

    def feed(self, update: ChatUpdate) -> tuple[str, str]:
        """(new reasoning, new answer) of an update; the final update also releases what was held back."""
        new_reasoning = update.reasoning[len(self.reasoning):] if update.reasoning.startswith(self.reasoning) else ""
        self.reasoning += new_reasoning
        new_answer = self.stops.feed(update.answer, final=update.done)
        self.answer += new_answer
        if update.done:
            self.stats = update.stats
        return new_reasoning, new_answer

    @property
    def finish_reason(self) -> str:
        if self.stops.hit or self.stats is None:
            return "stop"
        return "length" if self.stats.finish_reason == "length" else "stop"  # eos, or stopped by a stop event

    def usage(self) -> dict:
        prompt, completion = (self.stats.prompt_tokens, self.stats.new_tokens) if self.stats else (0, 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
