"""The login guard: ASGI middleware in front of Gradio's routes, installed only under ``--auth`` (``plugin.py``).

- Backoff: repeated failed logins from one client to one user name get slower (``LoginThrottle``, keyed by
  (address, user name)); while the pair waits, every ``POST /login`` of that user name from that address (the
  right password too) is refused with 429 and ``Retry-After``; other user names from the same address are not.
  A success forgets the pair. The address is the one the server reports: uvicorn replaces it with
  X-Forwarded-For only from the peers ``--forwarded-allow-ips`` names (none by default), so a client cannot
  reset its count by sending a new X-Forwarded-For.
- Expiry: Gradio 6.31 keeps a login token until logout or restart. The guard notes when each token was issued
  (the cookie of a successful ``/login``) and removes it from Gradio's token table once it is older than
  ``max_age_s``; that browser then logs in again.
- Job ownership: Gradio 6.31's ``POST /gradio_api/cancel`` checks no login at all; given a session hash and an
  event id it ends anyone's job. The guard binds each session hash to the login token that first joined the
  queue with it: a join of that session by another login gets 403, and only that login may cancel the
  session's jobs (another login, even of the same user, gets 403; no login gets 401).
- ``/metrics`` and the MCP mount: Gradio 6.31 checks no login on its MCP mount (``/gradio_api/mcp``), so the
  guard asks for one there and on ``/metrics``: Gradio's login cookie, or HTTP Basic with the ``--auth`` user
  and password (what Prometheus' ``basic_auth`` and most MCP clients send). Wrong Basic passwords count as
  failed logins in the same backoff.

The guard is outside the core's body limit: it reads at most ``max_body`` bytes of a body (the core's
``--max-request-bytes``, whose check inside it refuses any larger body) and passes one declared larger unread.
It runs on the server's event loop; its state is changed in single coroutine steps (no await between a read and
its update).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import parse_qs

from ui.guards import CANCEL_PATH, JOIN_PATH, content_length, json_object, read_body, replay, send_json

from .throttle import MAX_TRACKED, LoginThrottle

LOGIN_PATHS = ("/login", "/login/")
PROTECTED_PREFIXES = ("/metrics", "/gradio_api/mcp")


def gradio_logins(scope) -> tuple[dict, str]:
    """(login tokens, cookie id) of the Gradio app serving ``scope``.

    Gradio 6.31 keeps both on its FastAPI app (``App.tokens``: token -> user, ``App.cookie_id``), built at
    launch; Starlette puts the app it serves in ``scope["app"]`` before its middleware runs.
    """
    app = scope.get("app")
    return getattr(app, "tokens", {}), getattr(app, "cookie_id", "")


class LoginGuard:
    """The middleware (see the module docstring). ``auth``: the --auth (user, password); ``throttle``: the login
    backoff; tokens older than ``max_age_s`` (by ``clock``) are removed from Gradio's table."""

    def __init__(self, app, auth: tuple[str, str], throttle: LoginThrottle | None = None,
                 max_age_s: float = 24 * 3600.0, max_body: int = 8 * 2**20,
                 clock: Callable[[], float] = time.monotonic):
        self.app, self.auth, self.throttle = app, auth, throttle or LoginThrottle()
        self.max_age_s, self.max_body, self.clock = max_age_s, max_body, clock
        self._issued: OrderedDict[str, float] = OrderedDict()  # login token -> when it was issued, oldest first
        self._owners: OrderedDict[str, str] = OrderedDict()  # session hash -> login token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tokens, cookie_id = gradio_logins(scope)
        if self._issued:
            self._expire_logins(tokens)
        path = scope["path"]
        if path.startswith(PROTECTED_PREFIXES):
            return await self._gate(scope, receive, send, tokens, cookie_id)
        if scope["method"] != "POST" or (path not in LOGIN_PATHS and path.rstrip("/") not in (CANCEL_PATH, JOIN_PATH)):
            return await self.app(scope, receive, send)
        declared = content_length(scope)
        if declared is not None and declared > self.max_body:
            return await self.app(scope, receive, send)  # the body limit inside refuses it unread
        body, messages = await read_body(receive, self.max_body)
        if path in LOGIN_PATHS:
            return await self._login(scope, body, replay(messages, receive), send, cookie_id)
        if refusal := self._refusal(scope, body, tokens, cookie_id):
            return await send_json(send, *refusal)
        return await self.app(scope, replay(messages, receive), send)

    async def _login(self, scope, body: bytes, receive, send, cookie_id: str):
        client = (_address(scope), _login_user(scope, body))
        wait = self.throttle.retry_after(client)
        if wait > 0:
            seconds = math.ceil(wait)
            return await send_json(send, 429, {"detail": f"Too many failed logins: try again in {seconds} s."},
                                    [(b"retry-after", str(seconds).encode())])
        status = {}

        async def watching_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                for key, value in message.get("headers", ()):
                    token = _cookie_token(key, value, cookie_id)
                    if message["status"] == 200 and token:
                        self._issued[token] = self.clock()
            await send(message)

        await self.app(scope, receive, watching_send)
        if status.get("code") == 200:
            self.throttle.succeeded(client)
        elif status.get("code") in (400, 401):
            self.throttle.failed(client)

    def _expire_logins(self, tokens: dict) -> None:
        """Remove login tokens older than ``max_age_s`` from Gradio's token table (oldest first)."""
        now = self.clock()
        while self._issued:
            token, issued = next(iter(self._issued.items()))
            if now - issued <= self.max_age_s and len(self._issued) <= MAX_TRACKED:
                break
            del self._issued[token]
            tokens.pop(token, None)

    def _refusal(self, scope, body: bytes, tokens: dict, cookie_id: str) -> tuple[int, dict] | None:
        """(status, body) when this join or cancel is not the login's own, else None."""
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

    async def _gate(self, scope, receive, send, tokens: dict, cookie_id: str):
        """/metrics and the MCP mount: through with a login cookie or the right HTTP Basic, else 401 (429 while
        that user name backs off)."""
        if _login_token(scope, cookie_id) in tokens:
            return await self.app(scope, receive, send)
        credentials = _basic_credentials(scope)
        if credentials is not None:
            client = (_address(scope), credentials[0])  # (address, user), as /login
            wait = self.throttle.retry_after(client)
            if wait > 0:
                return await send_json(send, 429, {"detail": "Too many failed logins: try again later."},
                                        [(b"retry-after", str(int(wait) + 1).encode())])
            if self._matches(credentials):
                self.throttle.succeeded(client)
                return await self.app(scope, receive, send)
            self.throttle.failed(client)
        return await send_json(send, 401, {"detail": "Not authenticated: send HTTP Basic credentials (the --auth "
                                            "user and password) or the login cookie of POST /login."},
                                [(b"www-authenticate", b'Basic realm="showcase", charset="UTF-8"')])

    def _matches(self, credentials: tuple[str, str]) -> bool:
        user_ok = hmac.compare_digest(credentials[0].encode(), self.auth[0].encode())
        password_ok = hmac.compare_digest(credentials[1].encode(), self.auth[1].encode())
        return user_ok and password_ok


def _address(scope) -> str:
    return (scope.get("client") or ("unknown", 0))[0]


def _session_hash(body: bytes) -> str | None:
    session = json_object(body).get("session_hash")
    return session if isinstance(session, str) else None


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


def _basic_credentials(scope) -> tuple[str, str] | None:
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            kind, _, encoded = value.decode("latin-1").partition(" ")
            if kind.lower() != "basic":
                return None
            try:
                user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return (user, password) if sep else None
    return None
