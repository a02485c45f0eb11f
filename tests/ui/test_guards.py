"""The core's guards in front of Gradio's routes, with or without --auth: request bodies and uploads within their
limits, and a cap on one session's queued jobs (the login's guards: tests/tools/test_login.py)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest
from gradio_client import Client

from neuron_backend.image.engine import ImageRequest
from ui.guards import BodyLimit


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
