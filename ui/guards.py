"""Guards in front of Gradio's own routes (ASGI middleware, given to FastAPI through ``app_kwargs``).

- ``BodyLimit``: no request body is read past its limit (``--max-request-bytes``; an upload to
  ``/gradio_api/upload``: ``--max-file-size`` and its multipart framing); a larger one gets 413.

- ``LoginThrottle``: repeated failed logins from one client to one user name get slower: after
  ``free_failures`` wrong passwords each further try must wait, the wait doubling up to ``max_delay_s``;
  while it waits, every login of that user name from that address (the right password too) is refused
  with 429 and ``Retry-After``; other user names from the same address are not. A success forgets the
  pair. The address is the one the server reports: uvicorn replaces it with X-Forwarded-For only from
  the peers ``--forwarded-allow-ips`` names (none by default), so a client cannot reset its count by
  sending a new X-Forwarded-For.
- Login expiry: Gradio 6.31 keeps a login token until logout or restart. The guard notes when each
  token was issued (the cookie of a successful ``/login``) and removes it from Gradio's token table once
  it is older than ``login_max_age_s``; that browser then logs in again.
- Job ownership under ``--auth``: Gradio 6.31's ``POST /gradio_api/cancel`` checks no login at
  all; given a session hash and an event id it ends anyone's job. With auth on, the guard binds
  each session hash to the login token that first joined the queue with it, and lets only that
  login cancel the session's jobs: another login, even of the same user, gets 403; no
  login gets 401.
- Early cancels (``EarlyCancels``): gradio_client's ``job.cancel()`` in the first ~50 ms after
  ``submit()`` posts ``/gradio_api/cancel`` before the client has read its event id, and Gradio
  6.31 refuses a cancel without one (422): the cancel was lost and an image ran all its steps. The
  guard matches such a cancel to the job that session joined for that endpoint within
  ``window_s`` (before or after the cancel), fills in its event id for Gradio (which then drops
  it from the queue) and remembers it, so the handler drops it if it starts anyway.
- Jobs per session: a join is refused (429) while its session already has ``max_session_jobs`` jobs
  waiting or running (``session_jobs``), so one session cannot fill the queue ahead of everyone else.

All of them run on the server's event loop; their state is guarded by the GIL-atomic dict operations of a
single coroutine step (no awaits between a read and its update).
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from itertools import chain
from urllib.parse import parse_qs

from neuron_backend.messages import tr

LOGIN_PATHS = ("/login", "/login/")
CANCEL_PATH = "/gradio_api/cancel"  # (/gradio_api/reset is a no-op in 6.31)
JOIN_PATH = "/gradio_api/queue/join"
MAX_TRACKED = 10_000  # clients / sessions remembered; the oldest are forgotten first
UPLOAD_PATH = "/gradio_api/upload"
MAX_BODY = 8 * 1024 * 1024  # a /queue/join body larger than this is passed on unread (Gradio refuses it)
MULTIPART_FRAMING = 64 * 1024  # an upload's body beyond its file: boundaries, part headers, the file name


class LoginThrottle:
    """Backoff for failed logins per client key (the guards use (address, user name)). ``clock`` is injectable."""

    def __init__(self, free_failures: int = 5, base_delay_s: float = 1.0, max_delay_s: float = 60.0,
                 forget_after_s: float = 900.0, clock: Callable[[], float] = time.monotonic):
        self.free_failures, self.base_delay_s, self.max_delay_s = free_failures, base_delay_s, max_delay_s
        self.forget_after_s, self.clock = forget_after_s, clock
        self._clients: OrderedDict[str, tuple[int, float, float]] = OrderedDict()  # failures, last, locked until

    def retry_after(self, client) -> float:
        """Seconds before ``client`` may try to log in again (0: now)."""
        entry = self._clients.get(client)
        if entry is None:
            return 0.0
        failures, last, locked_until = entry
        now = self.clock()
        if now - last > self.forget_after_s:
            del self._clients[client]
            return 0.0
        return max(0.0, locked_until - now)

    def failed(self, client) -> None:
        now = self.clock()
        failures, _, _ = self._clients.pop(client, (0, now, now))
        failures += 1
        over = failures - self.free_failures
        wait = 0.0 if over <= 0 else min(self.base_delay_s * 2 ** (over - 1), self.max_delay_s)
        self._clients[client] = (failures, now, now + wait)
        while len(self._clients) > MAX_TRACKED:
            self._clients.popitem(last=False)

    def succeeded(self, client) -> None:
        self._clients.pop(client, None)


async def _send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})


async def _read_body(receive) -> tuple[bytes, list[dict]]:
    """The whole request body and the messages it came in (to replay them to the app)."""
    messages, chunks, size = [], [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body") or size > MAX_BODY:
            break
    return b"".join(chunks), messages


def _replay(messages: list[dict], receive):
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()

    return replayed


def _json_object(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _session_hash(body: bytes) -> str | None:
    value = _json_object(body).get("session_hash")
    return value if isinstance(value, str) else None


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
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await _send_json(send, 413, {"detail": _too_large(upload, limit)})
        state = {"read": 0, "refused": False, "started": False}

        async def counted_receive():
            message = await receive()
            if message["type"] == "http.request" and not state["refused"]:
                state["read"] += len(message.get("body", b""))
                if state["read"] > limit:
                    state["refused"] = True
                    if not state["started"]:
                        await _send_json(send, 413, {"detail": _too_large(upload, limit)})
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


def _content_length(scope) -> int | None:
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
    """The ASGI middleware: login backoff always, job ownership when the app has auth.

    ``auth_state`` returns (auth on, valid tokens, cookie id) of the running Gradio app; it is read
    per request because Gradio builds its app (and its token table) at launch; tokens older than
    ``login_max_age_s`` (by ``clock``) are removed from that table. ``early_cancels``
    is shared with the API handlers (``ui.api.drops_early_cancels``). ``session_jobs`` counts a
    session's jobs in the queue (``session_jobs(demo)``); None: no cap.
    """

    def __init__(self, app, throttle: LoginThrottle, auth_state: Callable[[], tuple[bool, dict, str]],
                 early_cancels: EarlyCancels | None = None,
                 session_jobs: Callable[[str, int], int | None] | None = None, max_session_jobs: int = 2,
                 login_max_age_s: float = 24 * 3600.0, clock: Callable[[], float] = time.monotonic):
        self.app, self.throttle, self.auth_state = app, throttle, auth_state
        self.login_max_age_s, self.clock = login_max_age_s, clock
        self._issued: OrderedDict[str, float] = OrderedDict()  # login token -> when it was issued, oldest first
        self.early_cancels = early_cancels or EarlyCancels()
        self.session_jobs, self.max_session_jobs = session_jobs, max_session_jobs
        self._owners: OrderedDict[str, str] = OrderedDict()  # session hash -> login token
        self._joining: dict[str, int] = {}  # session hash -> its capped joins not yet answered

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self._issued:
            self._expire_logins()
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path in LOGIN_PATHS:
            return await self._login(scope, receive, send)
        if path.rstrip("/") in (CANCEL_PATH, JOIN_PATH):
            body, messages = await _read_body(receive)
            auth, tokens, cookie_id = self.auth_state()
            if auth and (refusal := self._refusal(scope, body, tokens, cookie_id)):
                return await _send_json(send, *refusal)
            counted = self._capped_session(body) if path.rstrip("/") == JOIN_PATH else None
            if counted is False:
                return await _send_json(send, 429, {"detail": tr(
                    "This session already has {limit} jobs waiting or running, the most one session may have "
                    "(--max-session-jobs): wait for the running job to finish, then try again.",
                    limit=self.max_session_jobs)})
            try:
                return await self._early_cancels(scope, body, _replay(messages, receive), send)
            finally:
                if counted:
                    self._joining[counted] -= 1
                    if not self._joining[counted]:
                        del self._joining[counted]
        return await self.app(scope, receive, send)

    async def _login(self, scope, receive, send):
        body, messages = await _read_body(receive)
        client = ((scope.get("client") or ("unknown", 0))[0], _login_user(scope, body))
        wait = self.throttle.retry_after(client)
        if wait > 0:
            seconds = math.ceil(wait)
            return await _send_json(send, 429, {"detail": f"Too many failed logins: try again in {seconds} s."},
                                    [(b"retry-after", str(seconds).encode())])
        status = {}
        _, _, cookie_id = self.auth_state()

        async def watching_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                for key, value in message.get("headers", ()):
                    token = _cookie_token(key, value, cookie_id)
                    if message["status"] == 200 and token:
                        self._issued[token] = self.clock()
            await send(message)

        await self.app(scope, _replay(messages, receive), watching_send)
        if status.get("code") == 200:
            self.throttle.succeeded(client)
        elif status.get("code") in (400, 401):
            self.throttle.failed(client)

    def _expire_logins(self) -> None:
        """Remove login tokens older than ``login_max_age_s`` from Gradio's token table (oldest first)."""
        _, tokens, _ = self.auth_state()
        now = self.clock()
        while self._issued:
            token, issued = next(iter(self._issued.items()))
            if now - issued <= self.login_max_age_s and len(self._issued) <= MAX_TRACKED:
                break
            del self._issued[token]
            tokens.pop(token, None)

    def _capped_session(self, body: bytes) -> str | bool | None:
        """A join: False when its session is at the cap; else the session, now counted as joining until
        answered (a join's job enters the queue before its answer); None when the join is not capped."""
        request = _json_object(body)
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

    def _refusal(self, scope, body: bytes, tokens: dict, cookie_id: str) -> tuple[int, dict] | None:
        """With auth: (status, body) when this join or cancel is not the login's own, else None."""
        token = _login_token(scope, cookie_id)
        session = _session_hash(body)
        if scope["path"].rstrip("/") == JOIN_PATH:
            if token in tokens and session is not None:
                owner = self._owners.setdefault(session, token)
                if owner != token:
                    return 403, {"detail": "This session belongs to another login."}
                self._owners.move_to_end(session)
                while len(self._owners) > MAX_TRACKED:
                    self._owners.popitem(last=False)
        elif token not in tokens:
            return 401, {"detail": "Not authenticated: log in first."}
        elif session is None or self._owners.get(session) != token:
            return 403, {"detail": "Only the login that started a job can cancel it."}
        return None

    async def _early_cancels(self, scope, body: bytes, receive, send):
        """Note each join's event id; give a cancel without one the id of the job it meant (EarlyCancels)."""
        request = _json_object(body)
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
            return await self.app(scope, _replay([{"type": "http.request", "body": payload}], receive), send)
        answer = bytearray()

        async def watching_send(message):
            if message["type"] == "http.response.body" and len(answer) < 4096:
                answer.extend(message.get("body", b""))
                if not message.get("more_body"):
                    event_id = _json_object(bytes(answer)).get("event_id")
                    if isinstance(event_id, str):
                        self.early_cancels.joined(event_id, session, fn_index)
            await send(message)

        return await self.app(scope, receive, watching_send)


def _login_user(scope, body: bytes) -> str:
    """The user name of a login form (URL-encoded, as Gradio's page and gradio_client send it; "" otherwise)."""
    content_type = next((v for k, v in scope.get("headers", ()) if k.lower() == b"content-type"), b"")
    if not content_type.lower().startswith(b"application/x-www-form-urlencoded"):
        return ""
    try:
        users = parse_qs(body.decode("utf-8", "replace"), max_num_fields=16).get("username") or [""]
    except ValueError:  # more fields than a login form has
        return ""
    return users[0].strip()[:256]


def _cookie_token(key: bytes, value: bytes, cookie_id: str) -> str | None:
    """The login token a ``set-cookie`` header of Gradio's ``/login`` carries, else None."""
    if key.lower() != b"set-cookie":
        return None
    name, _, rest = value.decode("latin-1").partition("=")
    if name.strip() not in (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}"):
        return None
    return rest.split(";", 1)[0].strip() or None


def _login_token(scope, cookie_id: str) -> str | None:
    """Gradio's login cookie (``access-token-<id>`` or its ``-unsecure-`` twin) from the raw headers."""
    names = (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}")
    for key, value in scope.get("headers", ()):
        if key != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            name, _, token = part.strip().partition("=")
            if name in names and token:
                return token
    return None
