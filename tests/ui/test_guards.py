"""The core's edge and guards in front of Gradio's routes, with or without --auth: request bodies and uploads within
their limits, a cap on one session's queued jobs, refused joins counted whoever refused them, the plug-ins' layers
entered only by their paths, the early head only on the page (the login's guards: tests/tools/test_login.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest
from gradio_client import Client
from prometheus_client.parser import text_string_to_metric_families

from neuron_backend.image.engine import ImageRequest
from neuron_backend.metrics import Metrics
from neuron_backend.plugins import Layer
from ui.guards import BodyLimit, Edge
from ui.i18n import EARLY_HEAD


# ----- request bodies and uploads -----------------------------------------------------------------
def _through_body_limit(chunks: list[bytes], headers: list[tuple[bytes, bytes]], limit: int) -> tuple[int, int]:
    """(status the client got, bytes the app read) for a body sent in ``chunks`` through BodyLimit."""
    read, statuses, pending = [0], [], list(chunks)

    async def app(scope, receive, send):  # reads the whole body, as a route that parses JSON does
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            read[0] += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"parsed"})

    async def receive():
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": headers}
    asyncio.run(BodyLimit(app, max_bytes=limit, max_upload_bytes=10 * limit)(scope, receive, send))
    return statuses[0], read[0]


def test_a_body_over_the_limit_is_refused_before_it_is_read():
    declared = [(b"content-length", str(100 * 2**20).encode())]
    assert _through_body_limit([b"x" * 2**20] * 100, declared, 2**20) == (413, 0)  # refused unread
    assert _through_body_limit([b"x" * 2**16] * 100, [], 2**20) == (413, 2**20)  # chunked: cut at the limit
    assert _through_body_limit([b"x" * 2**16] * 16, [], 2**20) == (200, 2**20)  # at the limit: read whole


def _raw_post(url: str, path: str, headers: str, body: bytes = b"") -> tuple[int, bytes]:
    """(status, start of the answer) of a POST written by hand: a declared length need not be sent."""
    address = urlparse(url)
    with socket.create_connection((address.hostname, address.port), timeout=20) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {address.hostname}\r\n{headers}\r\n\r\n".encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            received = sock.recv(65536)
            if not received:
                break
            answer += received
    return int(answer.split(b" ", 2)[1]), answer


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@pytest.mark.slow
def test_request_bodies_and_uploads_over_their_limits_are_refused(warm_app):
    backend, url = warm_app
    limit, file_limit = backend.settings.max_request_bytes, backend.settings.max_file_size
    # A /chat join that claims 100 MB is answered at once, nothing read.
    status, answer = _raw_post(url, "/gradio_api/queue/join", f"Content-Type: application/json\r\n"
                               f"Content-Length: {100 * 2**20}")
    assert status == 413 and b"--max-request-bytes" in answer and b"Traceback" not in answer, answer
    # A chunked body (no length declared) is cut at the limit.
    chunk = b"x" * 2**16
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(limit // len(chunk) + 1)) + b"0\r\n\r\n"
    status, answer = _raw_post(url, "/gradio_api/queue/join", "Content-Type: application/json\r\n"
                               "Transfer-Encoding: chunked", chunks)
    assert status == 413, answer
    # One byte over --max-file-size: Gradio's own check (launch(max_file_size=...)) refuses the upload.
    refused = httpx.post(f"{url}gradio_api/upload", files={"files": ("big.bin", b"\0" * (file_limit + 1))},
                         timeout=60)
    assert refused.status_code == 413 and "maximum allowed size" in refused.text, refused.text[:300]
    accepted = httpx.post(f"{url}gradio_api/upload", files={"files": ("small.bin", b"\0" * 1000)}, timeout=60)
    assert accepted.status_code == 200
    assert Client(url, verbose=False).predict(message="hi", max_new_tokens=2, greedy=True, api_name="/chat")


# ----- jobs per session -----------------------------------------------------------------------------
def _image_job(client: Client, seed: int):
    return client.submit(prompt="q", size="64x64", steps=2, seed=seed, guidance=None, api_name="/generate_image")


@pytest.mark.slow
def test_one_session_cannot_hold_the_queue(warm_app):
    """With the image engine held, one session's third job is refused; another session's job joins and runs."""
    backend, url = warm_app
    cap, engine = backend.settings.max_session_jobs, backend.engine("image")
    started, release, holder_cancel = threading.Event(), threading.Event(), threading.Event()

    def hold(step, total, elapsed):
        started.set()
        release.wait(30)

    holder = threading.Thread(target=engine.generate, args=(ImageRequest("holder", "64x64", steps=2, seed=1), hold,
                                                             holder_cancel))
    holder.start()
    try:
        assert started.wait(30)
        mine, theirs = Client(url, verbose=False), Client(url, verbose=False)
        held = [_image_job(mine, seed) for seed in range(cap)]
        deadline = time.time() + 30
        while not all(job.communicator and job.communicator.event_id for job in held):  # both joined
            assert time.time() < deadline
            time.sleep(0.02)
        fn_index = mine._infer_fn_index("/generate_image", None)
        join = {"data": ["q", "64x64", 2, 9, None, 1, False], "fn_index": fn_index, "session_hash": mine.session_hash}
        refused = httpx.post(f"{url}gradio_api/queue/join", json=join, timeout=10)
        assert refused.status_code == 429, refused.text
        detail = refused.json()["detail"]
        assert f"already has {cap} jobs" in detail and "wait for the running job" in detail, detail
        with pytest.raises(httpx.HTTPStatusError, match="429"):
            _image_job(mine, 99).result(timeout=30)  # gradio_client sees the same refusal
        other = _image_job(theirs, 7)  # another session still joins
        release.set()
        assert other.result(timeout=60)[1]["seed"] == 7
        assert [job.result(timeout=60)[1]["seed"] for job in held] == list(range(cap))
        assert _image_job(mine, 11).result(timeout=60)[1]["seed"] == 11  # its jobs done, the session may queue again
    finally:
        release.set()
        holder_cancel.set()
        holder.join(30)


# ----- the edge: what every request passes before Gradio -----------------------------------------------------
PAGE = b"<!doctype html><html><head><title>x</title></head></html>"


def _through_edge(edge_kwargs: dict, method: str, path: str, status: int = 200, content_type: bytes = b"text/html",
                  body: bytes = b"", headers: tuple = ()) -> tuple[list[dict], list[str]]:
    """(messages the client got, paths Gradio was asked for) of one request through an ``Edge``."""
    reached, sent, pending = [], [], [body]

    async def gradio(scope, receive, send):
        while (await receive()).get("more_body"):  # reads the whole body, as a route that parses JSON does
            pass
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(PAGE)).encode())]})
        await send({"type": "http.response.body", "body": PAGE})

    async def receive():
        return {"type": "http.request", "body": pending.pop(0) if pending else b"", "more_body": False}

    async def send(message):
        sent.append(message)

    edge = Edge(gradio, **{"metrics": Metrics(), "max_bytes": 4096,
                           "max_upload_bytes": 4096, **edge_kwargs})
    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": list(headers)}
    asyncio.run(edge(scope, receive, send))
    return sent, reached


def _body(sent: list[dict]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_only_the_pages_gets_have_the_early_head():
    rewritten = PAGE.replace(b"<head>", b"<head>" + EARLY_HEAD.encode())
    pages = {"pages": ["/", "/about"]}
    assert _body(_through_edge(pages, "GET", "/")[0]) == rewritten
    assert _body(_through_edge(pages, "GET", "/about")[0]) == rewritten  # another page of the Blocks
    for method, path in (("POST", "/"), ("HEAD", "/"), ("GET", "/gradio_api/queue/data"), ("GET", "/assets/x.html"),
                         ("GET", "/gradio_api/file=/tmp/a.html"), ("GET", "/v1/models"), ("GET", "/about/")):
        sent, reached = _through_edge(pages, method, path)
        assert reached == [path] and _body(sent) == PAGE, (method, path)  # answered by Gradio, untouched


class Answers:
    """A layer that answers ``status`` itself to a queue join (e.g. a login guard's 401) and records what entered it."""

    entered: list[str] = []

    def __init__(self, app, status: int | None = None):
        self.app, self.status = app, status

    async def __call__(self, scope, receive, send):
        Answers.entered.append(scope["path"])
        if self.status is not None and scope["path"] == "/gradio_api/queue/join":
            await send({"type": "http.response.start", "status": self.status, "headers": []})
            return await send({"type": "http.response.body", "body": b"refused"})
        await self.app(scope, receive, send)


def test_queue_joins_refused_before_any_handler_are_counted():
    """Gradio's queue full (503), a plug-in layer's login refusals (401, 403), the session cap (429) all count."""
    metrics = Metrics()
    join = json.dumps({"session_hash": "s", "fn_index": 0}).encode()
    for status in (200, 503, 503, 422):  # Gradio's own answers
        _through_edge({"metrics": metrics}, "POST", "/gradio_api/queue/join", status=status, body=join)
    for status in (401, 403):
        sent, reached = _through_edge({"metrics": metrics, "layers": [Layer(Answers, {"status": status})]}, "POST",
                                      "/gradio_api/queue/join", body=join)
        assert sent[0]["status"] == status and reached == []
    sent, reached = _through_edge({"metrics": metrics, "session_jobs": lambda session, fn: 2, "max_session_jobs": 2},
                                  "POST", "/gradio_api/queue/join", body=join)
    assert sent[0]["status"] == 429 and reached == []  # the session cap, inside the layers
    _through_edge({"metrics": metrics}, "POST", "/gradio_api/cancel", status=503, body=join)  # not a join
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.exposition().decode()) for s in family.samples}

    def refused(reason):
        return samples.get(("showcase_refusals_total", (("endpoint", "queue"), ("reason", reason))), 0)

    assert (refused("busy"), refused("auth"), refused("bad_input")) == (3, 2, 1)


def test_a_layer_with_a_prefix_is_entered_only_by_its_paths_and_sees_the_body_limit():
    scoped, everywhere = Layer(Answers, prefix="/v1"), Layer(Answers)
    paths = ("/v1", "/v1/models", "/v1x", "/chat", "/", "/gradio_api/queue/join")
    Answers.entered = []
    for path in paths:
        assert _through_edge({"layers": [scoped]}, "GET", path)[1] == [path]  # Gradio answers each
    assert Answers.entered == ["/v1", "/v1/models"]
    Answers.entered = []
    for path in paths:
        _through_edge({"layers": [everywhere]}, "GET", path)
    assert Answers.entered == list(paths)
    seen = []

    class Watches(Answers):
        async def __call__(self, scope, receive, send):
            async def watching(message):
                seen.append(message.get("status"))
                await send(message)

            await self.app(scope, receive, watching)

    sent, reached = _through_edge({"layers": [Layer(Watches, prefix="/v1")]}, "POST", "/v1/chat/completions",
                                  body=b"x" * 5000, headers=[(b"content-length", b"5000")])
    assert sent[0]["status"] == 413 and reached == [] and seen[0] == 413  # the limit is inside the layer
