"""Bounded reads from a remote server: every body this app reads from a chat server or an image worker has a cap,
and no redirect is followed.

A server may be wrong or hostile: one that ignores ``max_tokens``, streams one 200 MB chunk, answers ``/readyz``
with 600 MB, or redirects the conversation elsewhere. The caps here hold whatever it sends: the bytes are counted as
they arrive and the read stops at the cap, before the SDK or a JSON parser holds the whole body.

- ``BoundedTransport``: the transport of the chat engine's ``openai`` client (its HTTP library, httpx2). A streamed
  chat completion may carry ``reply_bytes(max_tokens)``; any other body ``MAX_BODY_BYTES``.
- ``get_json``: one GET of a small JSON document (a worker's ``/readyz``, ``/healthz``), at most ``MAX_BODY_BYTES``.
"""

from __future__ import annotations

import json

MAX_BODY_BYTES = 1 << 20  # a model list, an error, a /readyz: far smaller than this
REPLY_BASE_BYTES = 256 << 10  # a streamed reply's envelope: the first and last events, the usage, errors
TOKEN_EVENT_BYTES = 2 << 10  # one streamed event of one token with its JSON envelope (~300 bytes in practice)


class BodyTooLarge(Exception):
    """A remote body passed its cap; ``limit`` is the cap in bytes, ``url`` where it came from."""

    def __init__(self, url: str, limit: int):
        self.url, self.limit = url, limit
        super().__init__(f"the body from {url} passed {limit} bytes")


def reply_bytes(max_tokens: int) -> int:
    """The most bytes a streamed chat completion of ``max_tokens`` tokens may take."""
    return REPLY_BASE_BYTES + max(0, max_tokens) * TOKEN_EVENT_BYTES


def _limit_of(request) -> int:
    """The cap of ``request``'s answer: a streamed completion's from its own ``max_tokens``, else MAX_BODY_BYTES."""
    if request.method == "POST" and request.url.path.endswith("/chat/completions"):
        try:
            body = json.loads(request.content or b"{}")
        except ValueError:
            return MAX_BODY_BYTES
        if isinstance(body, dict) and isinstance(body.get("max_tokens"), int):
            return reply_bytes(body["max_tokens"])
    return MAX_BODY_BYTES


def bounded_transport():
    """An httpx2 transport whose every response body stops at its cap (``BodyTooLarge``); see the module docstring."""
    import httpx2

    class CountedStream(httpx2.SyncByteStream):
        def __init__(self, stream, url: str, limit: int):
            self._stream, self._url, self._limit, self.count = stream, url, limit, 0

        def __iter__(self):
            for part in self._stream:
                self.count += len(part)
                if self.count > self._limit:
                    raise BodyTooLarge(self._url, self._limit)
                yield part

        def close(self) -> None:
            self._stream.close()

    class BoundedTransport(httpx2.HTTPTransport):
        def handle_request(self, request):
            request.headers["Accept-Encoding"] = "identity"  # the cap counts what the SDK will hold: no gzip bomb
            response = super().handle_request(request)
            response.stream = CountedStream(response.stream, str(request.url.copy_with(query=None)),
                                            _limit_of(request))
            return response

    return BoundedTransport()


def openai_http_client(openai):
    """The chat engine's HTTP client: the SDK's defaults, every body capped, redirects not followed."""
    return openai.DefaultHttpxClient(follow_redirects=False, transport=bounded_transport())


def get_json(url: str, timeout: float, limit: int = MAX_BODY_BYTES):
    """(status, the JSON body or None) of a GET of ``url``: no redirect followed, at most ``limit`` bytes read.

    Raises ``httpx.HTTPError`` when the server cannot be reached, ``BodyTooLarge`` past the cap.
    """
    import httpx

    with httpx.stream("GET", url, timeout=timeout, follow_redirects=False,
                      headers={"Accept-Encoding": "identity"}) as answer:
        data = bytearray()
        for part in answer.iter_bytes():
            data += part
            if len(data) > limit:
                raise BodyTooLarge(url, limit)
    try:
        return answer.status_code, json.loads(bytes(data))
    except ValueError:
        return answer.status_code, None
