"""Every error answer under ``/v1`` in OpenAI's error object, whoever answered it.

The /v1 handlers answer ``{"error": {"message", "type", "param", "code"}}`` themselves (``schema.ApiError``). The
answers made before or around them are the framework's: an unknown path (404), a method a route does not take
(405, with ``Allow``), a body over ``--max-request-bytes`` (413, from ``ui.guards.BodyLimit``), all shaped
``{"detail": ...}`` or plain text. ``OpenAIErrors`` is an ASGI middleware that rewrites those, so OpenAI's clients
read the message and do not retry a client error. The plug-in installs it as a layer scoped to ``PREFIX``
(``plugin.py``): inside the core's refusal counter, around its body limit, entered only by /v1 requests; other
paths never reach it.
"""

from __future__ import annotations

import json

PREFIX = "/v1"
ROUTES = ("GET /v1/models", "GET /v1/models/{model}", "POST /v1/chat/completions", "POST /v1/images/generations",
          "POST /v1/images/edits", "GET /v1/images/files/{name}")
CODES = {404: "unknown_url", 405: "method_not_allowed", 413: "request_too_large"}
MAX_ERROR_BYTES = 64 << 10  # an error body rewritten here is a sentence or two; a longer one passes as it is


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    """OpenAI's error object as the bytes of a JSON body."""
    from .schema import ERROR_TYPES

    return json.dumps({"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                                 "param": param, "code": code}}).encode()


def _rewritten(scope, status: int, headers: list, body: bytes) -> bytes | None:
    """The OpenAI-shaped body of an error answer on /v1 (None: it is one already, or not one to touch)."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return None
    detail = parsed.get("detail") if isinstance(parsed, dict) else None
    method, path = scope.get("method", "?"), scope.get("path", "")[:200]
    if status == 404:
        message = f"No route {method} {path} here; /v1 serves: {', '.join(ROUTES)}."
    elif status == 405:
        allow = next((v.decode("latin-1") for k, v in headers if k.lower() == b"allow"), "")
        message = f"{method} is not allowed on {path}; use {allow or 'the method the route takes'}."
    elif isinstance(detail, str) and detail:
        message = detail
    else:
        message = body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    return openai_error(status, message, code=CODES.get(status))


class OpenAIErrors:
    """ASGI middleware: every error answer (4xx, 5xx) of the requests it is given in OpenAI's shape; it is given
    only /v1's (see the module docstring)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        held: dict = {}

        async def reshaping_send(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held.update(start=message, body=b"")
                return
            if "start" not in held or message["type"] != "http.response.body":
                return await send(message)
            held["body"] += message.get("body", b"")
            if message.get("more_body") and len(held["body"]) <= MAX_ERROR_BYTES:
                return
            start, body = held.pop("start"), held.pop("body")
            new = None if message.get("more_body") else _rewritten(scope, start["status"], start["headers"], body)
            if new is None:  # sent as it was
                await send(start)
                return await send({**message, "body": body})
            headers = [(k, v) for k, v in start["headers"] if k.lower() not in (b"content-length", b"content-type")]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(new)).encode())]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": new})

        await self.app(scope, receive, reshaping_send)
