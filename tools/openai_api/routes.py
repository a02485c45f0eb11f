"""The OpenAI-compatible API under ``/v1``: models, chat completions, image generations and edits, with errors
in OpenAI's schema, on the same Backend paths as ``/chat``, ``/generate_image`` and ``/edit_image``.

- ``GET /v1/models`` (and ``/v1/models/{id}``): the chat and image models with their declared shapes.
- ``POST /v1/chat/completions``: ``Backend.stream_chat``, as ``/chat`` (same engine, job queue,
  history limits, prompt builder and so the same control-token safety); Qwen3's thinking through
  ``chat_template_kwargs.enable_thinking`` and its reasoning apart in ``reasoning_content`` (vLLM's
  names); ``stop`` sequences end the reply through the engine's own per-reply stop event; streamed as
  server-sent events ending in ``data: [DONE]``.
- ``POST /v1/images/generations``: ``ui.api.ImageRun``, as ``/generate_image``; the PNGs keep their
  embedded parameters, as ``b64_json`` or as a URL under ``/v1/images/files/``.
- ``POST /v1/images/edits``: the same, from reference images sent as multipart files (``edits.py``), as
  ``/edit_image``; only where ``--references`` declares a count above 0.

Errors are ``{"error": {"message", "type", "param", "code"}}``: a bad request 400 (the message names
the allowed values), a shape still compiling 503 with ``Retry-After`` = its warm-up ETA in whole
seconds (the SDK's retries then wait for the compile), more requests than the engine's slots plus
``--queue-size`` waiting 429. Auth: with a key configured (``--api-key``) every route needs
``Authorization: Bearer <key>``; with ``--auth`` and no key /v1 is closed; without either it is open,
like the rest of an app that binds 127.0.0.1 by default. Wrong keys back off as failed logins do
(``tools.login.throttle.LoginThrottle`` per client address): past 5, the address waits (429 with ``Retry-After``),
the right key included.

Handlers run on the server's event loop; each chat reply is read on its own thread (``_ChatPump``)
and a client that goes away sets the reply's stop event, which frees the engine within one token
(an image stops at its next step). Messages here are for API clients: English, like ui/api.py's.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import io
import json
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from neuron_backend.chat.text import ChatRequest, ChatUpdate
from neuron_backend.errors import ShowcaseError, StorageError, storage_reason
from neuron_backend.image.png_info import png_metadata
from neuron_backend.runtime import Backend
from tools.login.throttle import LoginThrottle
from ui.api import ImageRun

from .edits import edit_call, edit_counts
from .metrics import ENDPOINTS as V1_ENDPOINTS
from .metrics import V1Metrics, v1_metrics
from .schema import ApiError, ChatCall, ImageCall, ReplyText, StopScan, chat_call, image_call, model_names, refusal

log = logging.getLogger("showcase")

MAX_BODY = 8 * 1024 * 1024  # bytes of one request's JSON
WAIT_POLL_S = 0.25  # how often a waiting handler looks for a client that went away
FILE_NAME = re.compile(r"^[\w.-]{1,200}\.png$")  # the names this API hands out; never a path
ROUTE_ENGINES = {"chat": "chat", "images": "image", "edits": "image"}


_END = object()


class _ChatPump:
    """One reply of ``Backend.stream_chat`` read on its own thread, its updates handed to the event loop.

    ``stop()`` sets the reply's stop event: the engine ends it within one token (even before it
    started) and the stream still ends with its final update.
    """

    def __init__(self, backend: Backend, request: ChatRequest):
        self._stop = threading.Event()
        self._loop, self._queue = asyncio.get_running_loop(), asyncio.Queue()
        threading.Thread(target=self._run, args=(backend, request), name="v1-chat", daemon=True).start()

    def _run(self, backend: Backend, request: ChatRequest) -> None:
        updates = backend.stream_chat(request, self._stop)
        try:
            for update in updates:
                self._put(update)
        except BaseException as exc:  # noqa: BLE001 - handed to the handler by next()
            self._put(exc)
        finally:
            updates.close()
            self._put(_END)

    def _put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the server's loop has closed: nobody reads this reply any more
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    async def next(self, gone: Callable | None = None) -> ChatUpdate | None:
        """The next update (None at the end), or what the reply raised; ``gone``: an async check for a
        client that went away, made while waiting (then the reply stops and ClientGone is raised)."""
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(), WAIT_POLL_S if gone else None)
            except TimeoutError:
                if await gone():
                    self.stop()
                    raise ClientGone from None
                continue
            if item is _END:
                return None
            if isinstance(item, BaseException):
                raise item
            return item


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


# ----- admission: the engine's slots plus --queue-size ------------------------------------------------
class Admission:
    """/v1 requests waiting for or running on each engine; past the engine's slots plus ``--queue-size``
    (less the requests waiting in Gradio's queue) a request is refused with 429.

    Touched only on the event loop, with no await between a count's read and its update.
    """

    def __init__(self, backend: Backend):
        self.backend, self.counts = backend, {"chat": 0, "image": 0}

    def enter(self, engine: str) -> Callable[[], None]:
        """Count one request in (or refuse it); returns the release, safe to call more than once."""
        s = self.backend.settings
        slots = self.backend.chat_slots() if engine == "chat" else self.backend.image_slots()
        depth = self.backend.metrics.queue_depth  # Gradio's waiting events (ui.serve sets it)
        waiting = depth() if depth is not None else 0
        if self.counts[engine] + waiting >= slots + s.queue_size:
            raise ApiError(429, f"The {engine} engine is busy: {self.counts[engine] + waiting} requests are running "
                           f"or waiting (at most {slots + s.queue_size}); try again shortly.", code="queue_full")
        self.counts[engine] += 1
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                self.counts[engine] -= 1

        return release


# ----- the routes -------------------------------------------------------------------------------------
def _authorized(request: Request, settings, api_key: str | None, throttle: LoginThrottle) -> None:
    """Raise 401 unless the request may use /v1, 429 while its address is backing off (see the module docstring)."""
    if api_key is None:
        if settings.auth is None:
            return
        raise ApiError(401, "/v1 needs an API key on a server with --auth: start it with --api-key KEY (or "
                       "SHOWCASE_API_KEY) and send \"Authorization: Bearer KEY\".", code="invalid_api_key")
    client = ((request.client.host if request.client else "unknown"), "/v1 api key")
    wait = throttle.retry_after(client)
    if wait > 0:
        raise ApiError(429, f"Too many wrong API keys from this address: try again in {math.ceil(wait)} s.",
                       code="too_many_wrong_keys", retry_after=math.ceil(wait))
    kind, _, token = request.headers.get("authorization", "").partition(" ")
    if kind.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        throttle.failed(client)
        raise ApiError(401, "Missing or wrong API key: send \"Authorization: Bearer <the server's --api-key>\".",
                       code="invalid_api_key")
    throttle.succeeded(client)


async def _json_body(request: Request) -> dict:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, f"The request body is over {MAX_BODY} bytes, the most /v1 reads.",
                           code="request_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    return body


@dataclass
class OpenAIRoutes:
    """The /v1 handlers of one Backend (``routes()`` lists them for ``app_kwargs``)."""

    backend: Backend
    api_key: str | None = field(default=None, repr=False)  # --api-key: the bearer key /v1 asks for
    admission: Admission = field(init=False)
    metrics: V1Metrics = field(init=False)  # the /v1 series, beside the core's in the Backend's registry
    throttle: LoginThrottle = field(default_factory=LoginThrottle)  # wrong API keys, per client address
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.admission = Admission(self.backend)
        self.metrics = v1_metrics(self.backend.metrics)

    def routes(self) -> list[Route]:
        return [Route("/v1/models", self._answer("models", self.models), methods=["GET"]),
                Route("/v1/models/{model:path}", self._answer("models", self.model), methods=["GET"]),
                Route("/v1/chat/completions", self._answer("chat", self.chat), methods=["POST"]),
                Route("/v1/images/generations", self._answer("images", self.images), methods=["POST"]),
                Route("/v1/images/edits", self._answer("edits", self.edits), methods=["POST"]),
                Route("/v1/images/files/{name}", self._answer("files", self.file), methods=["GET"])]

    def _answer(self, route: str, handler):
        """The handler behind auth, with refusals in OpenAI's schema, counted in the metrics."""

        metrics, v1, path = self.backend.metrics, self.metrics, V1_ENDPOINTS[route]

        async def endpoint(request: Request) -> Response:
            arrived = time.monotonic()  # no web queue in front of /v1: the clock starts at the request
            try:
                _authorized(request, self.backend.settings, self.api_key, self.throttle)
                response = await handler(request)
            except ShowcaseError as exc:  # a check of the backend's on the request (e.g. a message's content): 400
                error = refusal(self.backend, ROUTE_ENGINES.get(route, "chat"), exc)
                v1.answered(route, error.status, error.type)
                self._refused(path, error)
                metrics.observe_latency(path, time.monotonic() - arrived)
                return _error_response(error)
            except ApiError as exc:
                v1.answered(route, exc.status, exc.type)
                self._refused(path, exc)
                metrics.observe_latency(path, time.monotonic() - arrived)
                return _error_response(exc)
            except Exception:
                log.exception("/v1 %s failed", route)
                error = ApiError(500, "The server failed on this request; its log says why.", code="server_error")
                v1.answered(route, 500, error.type)
                metrics.observe_latency(path, time.monotonic() - arrived)
                return _error_response(error)
            v1.answered(route, response.status_code)
            return _timed(response, lambda: metrics.observe_latency(path, time.monotonic() - arrived))

        return endpoint

    def _refused(self, path: str, error: ApiError) -> None:
        reason = _refusal_reason(error)
        if reason is not None:
            self.backend.metrics.refused(path, reason)

    # ----- models ---------------------------------------------------------------------------------
    def describe_model(self, engine: str) -> dict:
        """One entry of /v1/models: OpenAI's fields, then the declared shapes and what runs."""
        b, s = self.backend, self.backend.settings
        entry = {"id": model_names(b, engine)[0], "object": "model", "created": self.created,
                 "owned_by": "trainium-showcase", "engine": engine, "runs": str(b.model_id(engine)),
                 "demo": b.runs_demo(engine) or engine in b.fallbacks, "state": b.engine_states()[engine],
                 "placement": b.placements[engine].label(), "shapes": b.shape_states(engine)}
        if engine == "chat" and b.remote(engine):  # the buckets and the cache are the chat server's
            try:
                context = b.engine("chat").context_length  # as the server says
            except ShowcaseError:  # not connected yet
                context = None
            entry.update(context_length=context, max_new_tokens=s.max_new_tokens)
        elif engine == "chat":
            entry.update(buckets=list(s.buckets), context_length=s.context_length, cache_windows=list(s.cache_windows),
                         max_new_tokens=s.max_new_tokens, chat_batch=b.chat_rows)
        else:
            entry.update(sizes=[size.label for size in s.sizes], default_steps=b.image_default_steps(),
                         max_steps=s.max_steps, max_images=s.max_images_per_run,
                         edits=list(edit_counts(b)))  # images /v1/images/edits takes per request; []: no editing
        return entry

    async def models(self, request: Request) -> Response:
        data = [self.describe_model(e) for e in ("chat", "image") if e in self.backend.placements]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        wanted = request.path_params["model"]
        for engine in self.backend.placements:
            if wanted in model_names(self.backend, engine):
                return JSONResponse(self.describe_model(engine))
        names = [model_names(self.backend, e)[0] for e in self.backend.placements]
        raise ApiError(404, f"The model {wanted!r} is not served here; use one of: {', '.join(names)}.", "model",
                       "model_not_found")

    # ----- chat -----------------------------------------------------------------------------------
    def _served(self, engine: str) -> None:
        """404 for an engine this server does not run (--no-chat, --no-image): not a wait, a wrong address."""
        if engine not in self.backend.placements:
            flag = "--no-chat" if engine == "chat" else "--no-image"
            names = [model_names(self.backend, e)[0] for e in self.backend.placements]
            raise ApiError(404, f"This server runs no {engine} model (it was started with {flag}); it serves: "
                           f"{', '.join(names) or 'nothing'}.", "model", "model_not_found")

    async def chat(self, request: Request) -> Response:
        self._served("chat")
        call = chat_call(await _json_body(request), self.backend)
        release = self.admission.enter("chat")
        try:
            pump = _ChatPump(self.backend, call.request)
            text = ReplyText(StopScan(call.stops))
            try:
                first = await pump.next(request.is_disconnected)  # an error before any token is an HTTP error
            except ShowcaseError as exc:
                raise refusal(self.backend, "chat", exc) from None
            except ClientGone:
                return Response(status_code=499)
            if call.stream:
                streaming, release = release, None  # released when the stream ends
                return StreamingResponse(self._chat_events(call, pump, text, first, streaming),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            update = first
            while update is not None:
                text.feed(update)
                if text.stops.hit:
                    pump.stop()  # the rest of the reply is not wanted: the engine stops within one token
                try:
                    update = await pump.next(request.is_disconnected)
                except ShowcaseError as exc:
                    raise refusal(self.backend, "chat", exc) from None
            return JSONResponse(self._completion(call, text))
        except ClientGone:
            return Response(status_code=499)
        finally:
            if release is not None:
                release()

    def _completion(self, call: ChatCall, text: ReplyText) -> dict:
        self._count_tokens(text)
        message = {"role": "assistant", "content": text.answer, "reasoning_content": text.reasoning or None}
        return {"id": _new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
                "model": call.model, "usage": text.usage(),
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": text.finish_reason}]}

    async def _chat_events(self, call: ChatCall, pump: _ChatPump, text: ReplyText, first: ChatUpdate,
                           release: Callable[[], None]):
        """The SSE stream: a role chunk, one chunk per new text, the finish chunk, the usage chunk, [DONE].

        Starlette cancels this generator when the client goes away: the reply's stop event frees the engine.
        """
        reply_id, created = _new_id("chatcmpl"), int(time.time())

        def event(delta: dict, finish: str | None = None) -> str:
            chunk = {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": call.model,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if call.include_usage:
                chunk["usage"] = None
            return f"data: {json.dumps(chunk)}\n\n"

        try:
            yield event({"role": "assistant", "content": ""})
            update = first
            while update is not None:
                reasoning, answer = text.feed(update)
                if reasoning:
                    yield event({"reasoning_content": reasoning})
                if answer:
                    yield event({"content": answer})
                if text.stops.hit:
                    pump.stop()
                try:
                    update = await pump.next()
                except ShowcaseError as exc:  # after the first token only a stop or a failure can end it
                    error = refusal(self.backend, "chat", exc)
                    self._refused(V1_ENDPOINTS["chat"], error)
                    yield f"data: {json.dumps({'error': {'message': error.message, 'type': error.type}})}\n\n"
                    return
            yield event({}, text.finish_reason)
            self._count_tokens(text)
            if call.include_usage:
                usage = {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": call.model,
                         "choices": [], "usage": text.usage()}
                yield f"data: {json.dumps(usage)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            pump.stop()  # a no-op once the reply has ended
            release()

    def _count_tokens(self, text: ReplyText) -> None:
        usage = text.usage()
        self.metrics.used(usage["prompt_tokens"], usage["completion_tokens"])

    # ----- images ---------------------------------------------------------------------------------
    async def images(self, request: Request) -> Response:
        self._served("image")
        return await self._images(image_call(await _json_body(request), self.backend), request)

    async def edits(self, request: Request) -> Response:
        """/v1/images/edits: as /v1/images/generations, from the multipart form's image files (edits.py)."""
        self._served("image")
        return await self._images(await edit_call(request, self.backend), request)

    async def _images(self, call: ImageCall, request: Request) -> Response:
        """Run one image call in the image engine's queue; the answer as OpenAI's images response."""
        release = self.admission.enter("image")
        try:
            run = ImageRun(self.backend, call.request, preview=False)
            async for _ in run.updates():
                if await request.is_disconnected():
                    run.stop()  # at its next step, or before its first
                    return Response(status_code=499)
            try:
                results = run.call.results()
            except ShowcaseError as exc:
                raise refusal(self.backend, "image", exc) from None
        finally:
            release()
        data = [self._image_item(r, call.response_format, request) for r in results]
        return JSONResponse({"created": int(time.time()), "model": call.model, "data": data})

    def _image_item(self, result, form: str, request: Request) -> dict:
        """One image as OpenAI gives it, with its parameters (seed, steps, ...) as an extra field."""
        path = result.path
        if path is None:  # the outputs folder did not keep it: hand out a copy, parameters embedded
            buffer = io.BytesIO()
            result.image.save(buffer, format="PNG", pnginfo=png_metadata(result.params))
            data = buffer.getvalue()
            path = self._exported(data) if form == "url" else None
        else:
            data = path.read_bytes() if form == "b64_json" else b""
        item = {"revised_prompt": None, "parameters": result.params}
        if form == "b64_json":
            item["b64_json"] = base64.b64encode(data).decode("ascii")
        else:
            item["url"] = f"{str(request.base_url).rstrip('/')}/v1/images/files/{path.name}"
        return item

    def _exported(self, png: bytes) -> Path:
        """``png`` written where /v1/images/files serves it; 507 when the disk refuses (base64 needs no disk)."""
        try:
            return self.backend.exports.write(png, ".png", "image")
        except OSError as exc:
            reason = exc if isinstance(exc, StorageError) else storage_reason(exc)
            log.warning("/v1 could not keep an image for its URL: %s", exc)
            raise ApiError(507, f"The image was made but cannot be kept for a URL: {reason}. Ask for "
                           "response_format \"b64_json\", which needs no disk.", "response_format",
                           "insufficient_storage") from None

    async def file(self, request: Request) -> Response:
        """A PNG this API handed out by URL, from the folders the page serves (outputs, exports)."""
        name = request.path_params["name"]
        if FILE_NAME.match(name):
            for folder in self.backend.served_folders():
                path = Path(folder) / name
                if path.is_file():
                    return FileResponse(path, media_type="image/png")
        raise ApiError(404, f"No image named {name[:80]!r} here (old images are removed as new ones are saved).",
                       code="file_not_found")


def _refusal_reason(error: ApiError) -> str | None:
    """The refusal label of a /v1 error answer (None: a server failure, which is no refusal)."""
    if error.status == 401 or error.code == "too_many_wrong_keys":
        return "auth"
    if error.status == 429:
        return "busy"
    if error.status == 503:
        return "failed_shape" if error.code == "shape_failed" else "not_ready"
    return "bad_input" if 400 <= error.status < 500 else None


def _timed(response: Response, done: Callable[[], None]) -> Response:
    """``response`` with ``done()`` called after its last byte: at the end of a stream, else now."""
    if not isinstance(response, StreamingResponse):
        done()
        return response
    body = response.body_iterator

    async def timed_body():
        try:
            async for chunk in body:
                yield chunk
        finally:
            if hasattr(body, "aclose"):  # a client gone mid-stream: the reply's own finally runs now (stops it)
                await body.aclose()
            done()

    response.body_iterator = timed_body()
    return response


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def openai_routes(backend: Backend, api_key: str | None = None) -> list[Route]:
    """The /v1 routes of ``backend`` (for ``launch(app_kwargs={"routes": ...})``, as tools/probes/routes.py's)."""
    return OpenAIRoutes(backend, api_key).routes()
