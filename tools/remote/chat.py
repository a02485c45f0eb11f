"""The chat engine of ``--chat-server URL``: the replies come from an OpenAI-compatible server (vLLM Neuron, or
this app started with ``--no-image``) through the ``openai`` SDK, streamed as the in-process engine streams them.

What stays the same for everything above the engine (the Chat tab, ``/chat``, ``/v1``, the QA bench): the request
is checked here with the same limits, a reply streams as ``ChatUpdate``s whose last one carries ``ChatStats``, a
``stop`` event ends the reply within one token and still yields that final update, and closing the stream early
frees the server: its HTTP response is closed, and both vLLM and this app stop generating for a client that went
away. The server's thinking arrives either as ``reasoning_content`` (this app; vLLM with a reasoning parser) or as
``<think>`` tags in the text (vLLM without one): both end up in the update's ``reasoning``.

What the server decides, the server says: its buckets and compiled shapes, its queue (a full one answers 429:
``BusyError``), its token counts (``usage``). ``ChatStats.bucket`` is 0 here: the bucket is the server's.

What the server sends is bounded here, whatever it does (bounded.py): a reply ends with an error that says why once
it passes its own ``max_new_tokens`` (counted as streamed pieces) or its bytes; no body is read past its cap; a
redirect is refused, never followed (it would send the conversation elsewhere).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from neuron_backend.chat.text import ChatRequest, ChatStats, ChatUpdate, HistoryLimits, ThinkSplitter, normalize_request
from neuron_backend.errors import BusyError, EngineUnavailableError, InvalidRequestError
from neuron_backend.messages import tr
from neuron_backend.settings import Settings

from .bounded import BodyTooLarge, openai_http_client

CONNECT_TIMEOUT_S = 5.0  # opening a connection to the server
READ_TIMEOUT_S = 120.0  # between two chunks of a reply (a queued request waits on the server, in its queue)
POLL_S = 1.0  # how often connect() asks the server again while it is unreachable or warming up
GIVE_UP_S = 600.0  # an unreachable server fails the connect task after this long (a warming one is waited for)
STOP_POLL_S = 0.1  # how often a reply's watcher looks at its stop event


class RemoteChatEngine:
    """Chat replies from an OpenAI-compatible server. ``connect()`` first (the warm-up's task does)."""

    def __init__(self, settings: Settings, url: str, key: str | None = None):
        import openai

        self.settings, self.url = settings, url
        self._openai = openai
        # The SDK's own Timeout: it is the HTTP library the SDK is built on (httpx2 since openai 3.x), and the
        # client refuses any other library's Timeout.
        self._client = openai.OpenAI(base_url=self.url, api_key=key or "none", max_retries=0,
                                     timeout=openai.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                                     http_client=openai_http_client(openai))
        self.model: str | None = None  # the server's name of the chat model, found by connect()
        self.context_length = settings.context_length  # the server's, where it says (connect)
        self.demo = False  # the server runs a random-weight demo model (this app's /v1/models says so)
        self.warm_fraction = 0.0  # of the server's shapes ready, where it lists them (this app does), at the last look
        self.memory_note = None
        self._running: set[threading.Event] = set()  # the stop events of the replies streaming now (cancel)
        self._lock = threading.Lock()

    # ----- connecting ---------------------------------------------------------------------------------
    def connect(self, progress: Callable[[str], None] = lambda text: None) -> None:
        """Wait until the server lists a chat model that is ready; EngineUnavailableError when it stays unreachable
        for ``GIVE_UP_S`` or refuses this app. A server that answers but is still warming up is waited for."""
        give_up_s = GIVE_UP_S
        deadline = time.monotonic() + give_up_s
        while True:
            try:
                warming = self.look()
            except (self._openai.APIStatusError, BodyTooLarge) as exc:
                raise self.refusal(exc) from None
            except self._openai.APIError as exc:  # no connection, or no answer in time
                if isinstance(exc.__cause__, BodyTooLarge) or time.monotonic() > deadline:
                    raise self.refusal(exc) from None
                progress(tr("waiting for the chat server at {url}: {error}", url=self.url, error=_short(exc)))
            else:
                if warming is None:
                    progress(tr("{model} at {url}", model=self.model, url=self.url))
                    return
                progress(tr("the chat server at {url} is warming up: {state}", url=self.url, state=warming))
                deadline = time.monotonic() + give_up_s  # it answers: only a server gone quiet gives up
            time.sleep(POLL_S)

    def look(self) -> str | None:
        """One look at the server's model list: None once its chat model serves (``model`` is then set), else what
        it still warms up. Raises what the ``openai`` SDK raises (``refusal`` turns it into a typed error)."""
        entry = self._chat_entry(self._client.models.list(timeout=CONNECT_TIMEOUT_S * 2).data)
        extra = entry.model_extra or {}
        warming = _warming(extra)
        shapes = extra.get("shapes") or {}
        ready = sum(1 for shape in shapes.values() if (shape or {}).get("state") == "ready")
        self.warm_fraction = 1.0 if warming is None else ready / len(shapes) if shapes else 0.0
        if warming is None:
            self.model, self.demo = entry.id, bool(extra.get("demo"))  # this app says when it runs a demo model
            self.context_length = int(extra.get("context_length") or extra.get("max_model_len") or self.context_length)
        return warming

    def _chat_entry(self, models: list):
        """The model to ask for: --chat-model where the server serves it, else its first chat model."""
        chat = [m for m in models if (m.model_extra or {}).get("engine", "chat") == "chat"]
        if not chat:
            raise EngineUnavailableError(tr("The chat server at {url} serves no chat model (it lists: {models}).",
                                            url=self.url, models=", ".join(m.id for m in models) or "nothing"))
        return next((m for m in chat if m.id == self.settings.chat_model), chat[0])

    # ----- replies --------------------------------------------------------------------------------------
    def validate(self, request: ChatRequest | Mapping) -> ChatRequest:
        s = self.settings
        limits = HistoryLimits(s.max_history_messages, s.max_history_chars, s.max_prompt_chars)
        return normalize_request(request, s.max_prompt_chars, s.max_new_tokens, False, limits)

    def stream(self, request: ChatRequest | Mapping, stop: threading.Event | None = None) -> Iterator[ChatUpdate]:
        """Check the request and open the reply's stream at once (a refusal is raised here, before anything
        streams), then stream it; see the module docstring."""
        if self.model is None:
            raise EngineUnavailableError(tr("The chat server at {url} is not connected yet; try again shortly.",
                                            url=self.url))
        request = self.validate(request)
        started = time.perf_counter()
        try:
            response = self._client.chat.completions.create(**self._body(request))
        except (self._openai.APIError, BodyTooLarge) as exc:
            raise self.refusal(exc) from None
        return self._read(request, response, stop or threading.Event(), started)

    def cancel(self) -> bool:
        """Stop every reply streaming now (as the local engine stops the one it runs), each within one token."""
        with self._lock:
            running = list(self._running)
        for stop in running:
            stop.set()
        return bool(running)

    def _body(self, request: ChatRequest) -> dict:
        """The chat.completions arguments: OpenAI's fields, plus vLLM's top_k and chat_template_kwargs (this app's
        /v1 takes both too). Greedy is OpenAI's temperature 0; a seed is sent only for sampling, as the local
        engine uses one only then."""
        system = [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
        messages = [*system, *(dict(m) for m in request.history), {"role": "user", "content": request.message}]
        extra: dict = {"chat_template_kwargs": {"enable_thinking": request.thinking}}
        body = {"model": self.model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
                "max_tokens": request.max_new_tokens, "extra_body": extra}
        if request.greedy:
            body["temperature"] = 0
        else:
            body.update(temperature=request.temperature, top_p=request.top_p, seed=request.seed)
            extra["top_k"] = request.top_k
        return body

    def _read(self, request: ChatRequest, response, stop: threading.Event, started: float) -> Iterator[ChatUpdate]:
        splitter = ThinkSplitter(tags=request.thinking)
        thought, first, usage, finish, pieces = "", None, None, None, 0
        ended_stream = threading.Event()
        watcher = threading.Thread(target=_close_on_stop, args=(stop, ended_stream, response), daemon=True,
                                   name="chat-remote-stop")
        watcher.start()
        with self._lock:
            self._running.add(stop)
        try:
            for chunk in response:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    extra = choice.delta.model_extra or {}
                    reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
                    delta = reasoning + splitter.feed(choice.delta.content or "")
                    thought += reasoning
                    if delta:
                        first, pieces = first or time.perf_counter(), pieces + 1
                        if pieces > request.max_new_tokens:  # each streamed piece holds one token or more
                            raise self._overlong(request.max_new_tokens)
                        yield ChatUpdate(thought + splitter.reasoning, splitter.answer, delta, False, None, 0)
                if stop.is_set():
                    break
        except EngineUnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001 - a closed stream after a stop is the stop; else the server failed
            if isinstance(exc, BodyTooLarge) or isinstance(exc.__cause__, BodyTooLarge):
                raise self._overlong(request.max_new_tokens) from None
            if not stop.is_set():
                raise self.refusal(exc) from None
        finally:
            with self._lock:
                self._running.discard(stop)
            ended_stream.set()
            response.close()  # a reply left early (stop, or its consumer went away) frees the server
        ended = time.perf_counter()
        stopped = stop.is_set() and finish is None
        new_tokens = usage.completion_tokens if usage is not None else pieces
        reason = "stopped" if stopped else "length" if finish == "length" else "eos"
        decode_s = ended - first if first is not None else 0.0
        stats = ChatStats(
            prompt_tokens=usage.prompt_tokens if usage is not None else 0, bucket=0, new_tokens=new_tokens,
            time_to_first_token_s=None if first is None else first - started,
            tokens_per_s=(new_tokens - 1) / decode_s if new_tokens > 1 and decode_s > 0 else 0.0,
            total_s=ended - started, compiled_graphs=0, dropped_turns=0, context_length=self.context_length,
            max_new_tokens=request.max_new_tokens, stopped=stopped, finish_reason=reason,
            seed=None if request.greedy else request.seed)
        delta = splitter.finish()
        yield ChatUpdate(thought + splitter.reasoning, splitter.answer, delta, True, stats, 0)

    def _overlong(self, max_tokens: int) -> EngineUnavailableError:
        return EngineUnavailableError(tr("The chat server at {url} kept sending past the {tokens} tokens this reply "
                                         "may have (it ignores max_tokens), so the reply was cut there. Ask for a "
                                         "shorter reply, or fix the server.", url=self.url, tokens=max_tokens))

    def refusal(self, exc: Exception) -> Exception:
        """The typed error of a failed call: the server's refusal in its own words, or what to check here."""
        openai = self._openai
        cause = exc if isinstance(exc, BodyTooLarge) else exc.__cause__
        if isinstance(cause, BodyTooLarge):
            return EngineUnavailableError(tr("The chat server at {url} sent an answer of more than {limit} bytes, "
                                             "which this app does not read; check the server.", url=self.url,
                                             limit=cause.limit))
        if isinstance(exc, openai.APIStatusError) and 300 <= exc.status_code < 400:
            return EngineUnavailableError(tr("The chat server at {url} answered {status}, a redirect to {location}; "
                                             "this app does not follow redirects: give --chat-server the address "
                                             "that serves, if you trust it.", url=self.url, status=exc.status_code,
                                             location=exc.response.headers.get("location", "?")[:200]))
        if isinstance(exc, openai.APIStatusError):
            said = _server_message(exc)
            if exc.status_code == 400:
                return InvalidRequestError(said)
            if exc.status_code == 429:
                return BusyError(said)
            if exc.status_code in (401, 403):
                return EngineUnavailableError(tr("The chat server at {url} refused this app ({status}: {said}): give "
                                                 "--chat-server-key the key it was started with.",
                                                 url=self.url, status=exc.status_code, said=said))
            if exc.status_code == 404:
                return EngineUnavailableError(tr("The chat server at {url} answered 404 ({said}): --chat-server takes "
                                                 "its OpenAI base URL, which usually ends in /v1.",
                                                 url=self.url, said=said))
            return EngineUnavailableError(tr("The chat server at {url} answered {status}: {said}",
                                             url=self.url, status=exc.status_code, said=said))
        if isinstance(exc, openai.APITimeoutError):
            return EngineUnavailableError(tr("The chat server at {url} did not answer in time; try again, or check "
                                             "that it runs.", url=self.url))
        return EngineUnavailableError(tr("The chat server at {url} cannot be reached ({error}): check that it runs "
                                         "and that --chat-server is its address.", url=self.url, error=_short(exc)))


def _close_on_stop(stop: threading.Event, ended: threading.Event, response) -> None:
    """Hang up once ``stop`` is set, so a reply waiting for its next chunk ends at once and the server hears it.

    Closing a socket does not wake a read another thread waits in, nor send anything while that read holds it;
    shutting it down does both. The socket is httpcore's documented ``network_stream`` response extension."""
    while not ended.wait(STOP_POLL_S):
        if stop.is_set():
            try:
                network = response.response.extensions.get("network_stream")
                if network is not None and (sock := network.get_extra_info("socket")) is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed: the reply ended meanwhile
                pass
            return


def _warming(extra: Mapping) -> str | None:
    """What the server still warms up, from its model entry (None: it serves). This app's /v1/models says its
    engine's state and each shape's; vLLM lists a model only once it serves."""
    state = extra.get("state")
    if state not in (None, "ready"):
        return str(state)
    shapes = extra.get("shapes") or {}
    waiting = [name for name, shape in shapes.items() if (shape or {}).get("state") in ("queued", "running")]
    return f"{len(shapes) - len(waiting)}/{len(shapes)} shapes ready" if waiting else None


def _server_message(exc) -> str:
    body = exc.body if isinstance(exc.body, Mapping) else {}
    error = body.get("error", body)
    message = error.get("message") if isinstance(error, Mapping) else None
    return str(message or exc.message)[:500]


def _short(exc: Exception) -> str:
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"[:200]
