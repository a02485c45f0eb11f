"""What every request passes before Gradio: the core's one ASGI middleware (``Edge``, given to FastAPI through
``app_kwargs``): refused joins counted, the plug-ins' layers, ``BodyLimit``, then ``Guards`` (early cancels, jobs
per session) for joins and cancels and the early head for page GETs. Why each: docs/architecture.md, "The edge".
All of it runs on the server's event loop, with no await between a read of its state and its update.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from itertools import chain

from neuron_backend.messages import tr
from neuron_backend.metrics import QUEUE, Metrics, join_refusal_reason
from neuron_backend.plugins import Layer

from .i18n import with_early_head

CANCEL_PATH = "/gradio_api/cancel"  # (/gradio_api/reset is a no-op in 6.31)
JOIN_PATH = "/gradio_api/queue/join"
MAX_TRACKED = 10_000  # jobs / cancels remembered; the oldest are forgotten first
UPLOAD_PATH = "/gradio_api/upload"
MAX_BODY = 8 * 1024 * 1024  # a /queue/join body larger than this is passed on unread (Gradio refuses it)
MULTIPART_FRAMING = 64 * 1024  # an upload's body beyond its file: boundaries, part headers, the file name


async def send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})


async def read_body(receive, limit: int = MAX_BODY) -> tuple[bytes, list[dict]]:
    """The request body (cut once past ``limit``) and the messages it came in (to replay them to the app)."""
    messages, chunks, size = [], [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body") or size > limit:
            break
    return b"".join(chunks), messages


def replay(messages: list[dict], receive):
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()

    return replayed


def json_object(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


class EarlyCancels:
    """Cancels that arrived before their client knew the job's event id, matched to that job.

    A job is (session hash, fn index, event id); a cancel without an event id names the session
    and fn index. It takes every job of that pair that joined within ``window_s`` before it, or,
    when none has, the first one that joins within ``window_s`` after it (the client's join may
    still be on its way). ``take(event_id)`` tells a starting handler that its job was cancelled.
    Bounded: at most ``MAX_TRACKED`` of each are remembered, the oldest forgotten first.
    """

    def __init__(self, window_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.window_s, self.clock = window_s, clock
        self._joins: OrderedDict[str, tuple[str, int, float]] = OrderedDict()  # event id -> session, fn, when
        self._waiting: OrderedDict[tuple[str, int], float] = OrderedDict()  # a cancel with no job yet -> when
        self._cancelled: OrderedDict[str, float] = OrderedDict()  # event ids a handler must drop

    def joined(self, event_id: str, session: str, fn_index: int) -> None:
        now = self.clock()
        asked = self._waiting.pop((session, fn_index), None)
        if asked is not None and now - asked <= self.window_s:
            self._remember(self._cancelled, event_id, now)
        else:
            self._remember(self._joins, event_id, (session, fn_index, now))

    def cancelled(self, session: str, fn_index: int) -> str | None:
        """Record a cancel that came without an event id; returns the newest job it matched (None: none yet)."""
        now = self.clock()
        matched = [event_id for event_id, (s, f, when) in self._joins.items()
                   if s == session and f == fn_index and now - when <= self.window_s]
        for event_id in matched:
            del self._joins[event_id]
            self._remember(self._cancelled, event_id, now)
        if not matched:
            self._remember(self._waiting, (session, fn_index), now)
        return matched[-1] if matched else None

    def take(self, event_id: str | None) -> bool:
        """Whether the job ``event_id`` was cancelled before its client knew its id (asked once, at its start)."""
        return event_id is not None and self._cancelled.pop(event_id, None) is not None

    def _remember(self, table: OrderedDict, key, value) -> None:
        table.pop(key, None)
        table[key] = value
        while len(table) > MAX_TRACKED:
            table.popitem(last=False)


class BodyLimit:
    """413 for a request body over its limit, before the app has read more than the limit.

    A declared ``content-length`` over the limit is refused before anything is read; a body without
    one (chunked) is counted as the app reads it, and at the limit the app is told the client left
    while the client gets the 413 (what the app answers after that is dropped).
    """

    def __init__(self, app, max_bytes: int, max_upload_bytes: int):
        self.app, self.max_bytes, self.max_upload_bytes = app, max_bytes, max_upload_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope["path"].rstrip("/").endswith(UPLOAD_PATH)
        limit = self.max_upload_bytes + MULTIPART_FRAMING if upload else self.max_bytes
        declared = content_length(scope)
        if declared is not None and declared > limit:
            return await send_json(send, 413, {"detail": _too_large(upload, limit)})
        state = {"read": 0, "refused": False, "started": False}

        async def counted_receive():
            message = await receive()
            if message["type"] == "http.request" and not state["refused"]:
                state["read"] += len(message.get("body", b""))
                if state["read"] > limit:
                    state["refused"] = True
                    if not state["started"]:
                        await send_json(send, 413, {"detail": _too_large(upload, limit)})
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if state["refused"]:
                return
            state["started"] = state["started"] or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted_receive, guarded_send)


def _too_large(upload: bool, limit: int) -> str:
    if upload:
        return tr("The upload is larger than {mb} MB, the most this server accepts for one file (--max-file-size).",
                  mb=(limit - MULTIPART_FRAMING) // 2**20)
    return tr("The request is larger than {kb} KB, the most this server accepts (--max-request-bytes).",
              kb=limit // 1024)


def content_length(scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def session_jobs(demo) -> Callable[[str, int], int | None]:
    """How many of a session's jobs wait in Gradio's queue or run, for a join of ``fn_index`` (None: a
    function with no concurrency limit, which never waits: not capped and not counted).

    Reads Gradio 6.31's queue (``event_queue_per_concurrency_id``, ``active_jobs``) on the event loop,
    where the queue changes, so the lists are copied before they are walked.
    """

    def count(session: str, fn_index: int) -> int | None:
        fn = demo.fns.get(fn_index)
        queue = getattr(demo, "_queue", None)
        if fn is None or fn.concurrency_limit is None or queue is None:
            return None
        waiting = (e for q in list(queue.event_queue_per_concurrency_id.values()) for e in list(q.queue))
        running = (e for job in list(queue.active_jobs) if job for e in job)
        return sum(1 for e in chain(waiting, running)
                   if e.session_hash == session and e.fn.concurrency_limit is not None)

    return count


class Guards:
    """The ASGI middleware on joins and cancels: the per-session job cap and early cancels; any other request
    passes at once.

    ``early_cancels`` is shared with the API handlers (``ui.api.drops_early_cancels``). ``session_jobs`` counts
    a session's jobs in the queue (``session_jobs(demo)``); None: no cap.
    """

    def __init__(self, app, early_cancels: EarlyCancels | None = None,
                 session_jobs: Callable[[str, int], int | None] | None = None, max_session_jobs: int = 2):
        self.app = app
        self.early_cancels = early_cancels or EarlyCancels()
        self.session_jobs, self.max_session_jobs = session_jobs, max_session_jobs
        self._joining: dict[str, int] = {}  # session hash -> its capped joins not yet answered

    async def __call__(self, scope, receive, send):
        path = scope["path"].rstrip("/") if scope["type"] == "http" and scope["method"] == "POST" else None
        if path not in (CANCEL_PATH, JOIN_PATH):
            return await self.app(scope, receive, send)
        body, messages = await read_body(receive)
        counted = self._capped_session(body) if path == JOIN_PATH else None
        if counted is False:
            return await send_json(send, 429, {"detail": tr(
                "This session already has {limit} jobs waiting or running, the most one session may have "
                "(--max-session-jobs): wait for the running job to finish, then try again.",
                limit=self.max_session_jobs)})
        try:
            return await self._early_cancels(scope, body, replay(messages, receive), send)
        finally:
            if counted:
                self._joining[counted] -= 1
                if not self._joining[counted]:
                    del self._joining[counted]

    def _capped_session(self, body: bytes) -> str | bool | None:
        """A join: False when its session is at the cap; else the session, now counted as joining until
        answered (a join's job enters the queue before its answer); None when the join is not capped."""
        request = json_object(body)
        session, fn_index = request.get("session_hash"), request.get("fn_index")
        if self.session_jobs is None or not (isinstance(session, str) and isinstance(fn_index, int)):
            return None
        held = self.session_jobs(session, fn_index)
        if held is None:
            return None
        if held + self._joining.get(session, 0) >= self.max_session_jobs:
            return False
        self._joining[session] = self._joining.get(session, 0) + 1
        return session

    async def _early_cancels(self, scope, body: bytes, receive, send):
        """Note each join's event id; give a cancel without one the id of the job it meant (EarlyCancels)."""
        request = json_object(body)
        session, fn_index = request.get("session_hash"), request.get("fn_index")
        if not (isinstance(session, str) and isinstance(fn_index, int)):
            return await self.app(scope, receive, send)
        if scope["path"].rstrip("/") == CANCEL_PATH:
            if isinstance(request.get("event_id"), str):
                return await self.app(scope, receive, send)
            # Gradio needs a string id: the matched job's (dropped from its queue), else "" (no such job).
            request["event_id"] = self.early_cancels.cancelled(session, fn_index) or ""
            payload = json.dumps(request).encode()
            headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(payload)).encode())]}
            return await self.app(scope, replay([{"type": "http.request", "body": payload}], receive), send)
        answer = bytearray()

        async def watching_send(message):
            if message["type"] == "http.response.body" and len(answer) < 4096:
                answer.extend(message.get("body", b""))
                if not message.get("more_body"):
                    event_id = json_object(bytes(answer)).get("event_id")
                    if isinstance(event_id, str):
                        self.early_cancels.joined(event_id, session, fn_index)
            await send(message)

        return await self.app(scope, receive, watching_send)


class Under:
    """A plug-in's layer entered only by requests whose path is ``prefix`` or under it; the others go to ``bypass``
    (what the layer wraps) as if it were not there."""

    def __init__(self, prefix: str, app, bypass):
        self.prefix, self.app, self.bypass = prefix.rstrip("/"), app, bypass

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if path == self.prefix or path.startswith(self.prefix + "/"):
            return await self.app(scope, receive, send)
        return await self.bypass(scope, receive, send)


class Edge:
    """The core's one ASGI middleware: the refusal counter, the plug-ins' ``layers`` (outermost first), the body
    limit, then joins and cancels to ``Guards`` and GETs of ``pages`` (the page's paths: "/" and any other page of
    the Blocks) to the early head.

    ``metrics``: where refused joins count; ``early_cancels``, ``session_jobs``, ``max_session_jobs``: the
    ``Guards``'; ``max_bytes``, ``max_upload_bytes``: the ``BodyLimit``'s. ``app``: Gradio's app.
    """

    def __init__(self, app, metrics: Metrics, max_bytes: int, max_upload_bytes: int,
                 early_cancels: EarlyCancels | None = None,
                 session_jobs: Callable[[str, int], int | None] | None = None, max_session_jobs: int = 2,
                 pages: Iterable[str] = ("/",), layers: Iterable[Layer] = ()):
        self.gradio, self.metrics, self.pages = app, metrics, frozenset(pages)
        self.guards = Guards(app, early_cancels, session_jobs, max_session_jobs)
        inner = BodyLimit(self._route, max_bytes, max_upload_bytes)
        for layer in reversed(tuple(layers)):
            wrapped = layer.cls(inner, **layer.kwargs)
            inner = Under(layer.prefix, wrapped, inner) if layer.prefix else wrapped
        self.app = inner  # the next inward: the outermost layer, else the body limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != JOIN_PATH:
            return await self.app(scope, receive, send)

        async def counting_send(message):  # reads only the answer's status line
            if message["type"] == "http.response.start":
                reason = join_refusal_reason(message["status"])
                if reason is not None:
                    self.metrics.refused(QUEUE, reason)
            await send(message)

        return await self.app(scope, receive, counting_send)

    async def _route(self, scope, receive, send):
        """Inside the body limit: joins and cancels to the guards, page GETs to the early head, the rest to Gradio."""
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            if method == "POST" and path.rstrip("/") in (JOIN_PATH, CANCEL_PATH):
                return await self.guards(scope, receive, send)
            if method == "GET" and path in self.pages:
                return await with_early_head(self.gradio, scope, receive, send)
        return await self.gradio(scope, receive, send)
