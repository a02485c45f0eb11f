"""The guards in front of Gradio's routes: login backoff, a job cancelled only by the login that started it,
request bodies and uploads within their limits, and a cap on one session's queued jobs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest
from gradio_client import Client
from support.app import free_port, warm_backend

import ui
from neuron_backend.image.engine import ImageRequest
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from ui.guards import BodyLimit, LoginThrottle

ADA = ("127.0.0.1", "ada")  # the login backoff's key: (address, user name)


def _login(url: str, password: str, client: httpx.Client | None = None, user: str = "ada",
           headers: dict | None = None) -> httpx.Response:
    post = (client or httpx).post
    return post(f"{url}login", data={"username": user, "password": password}, headers=headers, timeout=10)


@pytest.fixture
def auth_app(tmp_path):
    """The page with --auth on the tiny chat model (no warm-up: logins need no engine), its throttle and demo."""
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-image",
                               "--port", str(free_port()), "--auth", "ada:lovelace", "--login-max-age", "0.001"],
                              env={})
    throttle = LoginThrottle(free_failures=2, base_delay_s=30.0, max_delay_s=60.0)
    demo, (_, url, _) = ui.serve(Backend(settings), throttle=throttle, prevent_thread_lock=True, quiet=True)
    try:
        yield url, throttle, demo
    finally:
        demo.close()


def test_the_login_backoff_is_per_user_name_and_ignores_forged_forwarded_for(auth_app):
    url, throttle, _ = auth_app
    assert [_login(url, "guess", user="eve").status_code for _ in range(4)] == [400, 400, 400, 429]
    assert _login(url, "lovelace").status_code == 200  # another user name from the same address: not locked
    forged = [_login(url, "guess", user="eve", headers={"X-Forwarded-For": f"203.0.113.{n}"}).status_code
              for n in range(3)]
    assert forged == [429] * 3  # a new X-Forwarded-For from loopback is still the same client
    assert throttle.retry_after(("127.0.0.1", "eve")) > 0 and throttle.retry_after(ADA) == 0


@pytest.mark.slow
def test_a_login_token_expires_after_login_max_age(auth_app):
    url, _, demo = auth_app
    with httpx.Client() as client:
        assert _login(url, "lovelace", client).status_code == 200
        assert client.get(f"{url}gradio_api/info", timeout=10).status_code == 200
        assert len(demo.server_app.tokens) == 1
        time.sleep(3.7)  # --login-max-age 0.001 h: 3.6 s
        assert client.get(f"{url}gradio_api/info", timeout=10).status_code == 401
        assert demo.server_app.tokens == {}
        assert _login(url, "lovelace", client).status_code == 200  # logging in again works
        assert client.get(f"{url}gradio_api/info", timeout=10).status_code == 200


@pytest.mark.slow
def test_repeated_login_failures_get_refused_until_the_window_passes(tmp_path, demo_models):
    """20 wrong passwords from one client: after 5 each further try waits, doubling."""
    backend = warm_backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image")
    throttle = LoginThrottle(free_failures=5, base_delay_s=3.0, max_delay_s=6.0)  # 3 s: 14 requests fit
    demo, (_, url, _) = ui.serve(backend, throttle=throttle, prevent_thread_lock=True, quiet=True)
    try:
        codes = [_login(url, f"wrong-{i}").status_code for i in range(20)]
        assert codes[:5] == [400] * 5  # wrong, but not yet slowed down
        assert codes[5] == 400 and set(codes[6:]) == {429}, codes  # the 6th failure starts the lock
        locked = _login(url, "lovelace")
        assert locked.status_code == 429 and "try again in" in locked.json()["detail"]  # even the right one
        assert int(locked.headers["retry-after"]) >= 1
        deadline = time.monotonic() + 10
        while throttle.retry_after(ADA) > 0:  # the lock's own clock, not a guessed sleep
            assert time.monotonic() < deadline
            time.sleep(throttle.retry_after(ADA))
        assert _login(url, "lovelace").status_code == 200  # after the window the right password works
        assert throttle.retry_after(ADA) == 0 and _login(url, "wrong").status_code == 400  # forgotten
    finally:
        demo.close()


def test_login_throttle_doubles_and_is_capped():
    now = [0.0]
    throttle = LoginThrottle(free_failures=2, base_delay_s=1.0, max_delay_s=4.0, clock=lambda: now[0])
    waits = []
    for _ in range(6):
        throttle.failed("a")
        waits.append(throttle.retry_after("a"))
    assert waits == [0.0, 0.0, 1.0, 2.0, 4.0, 4.0]
    assert throttle.retry_after("b") == 0.0  # per client
    now[0] += 3.0
    assert throttle.retry_after("a") == 1.0
    throttle.succeeded("a")
    assert throttle.retry_after("a") == 0.0


@pytest.mark.slow
def test_with_auth_only_the_login_that_started_a_job_can_cancel_it(tmp_path, demo_models):
    """Gradio 6.31's /gradio_api/cancel checks no login; the guard does."""
    backend = warm_backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image", "--context-length", "4096",
                       "--max-new-tokens", "4000")
    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)
    engine = backend.engine("chat")
    try:
        owner, other = (Client(url, auth=("ada", "lovelace"), verbose=False) for _ in range(2))
        job = owner.submit(message="long story", greedy=True, max_new_tokens=4000, api_name="/chat")
        deadline = time.time() + 60
        while not job.outputs():  # streaming: the engine is busy with this reply
            assert time.time() < deadline
            time.sleep(0.02)
        body = {"session_hash": owner.session_hash, "fn_index": owner._infer_fn_index("/chat", None),
                "event_id": job.communicator.event_id}
        cancel = f"{url}gradio_api/cancel"
        assert httpx.post(cancel, json=body, timeout=10).status_code == 401  # no login at all
        assert httpx.post(cancel, json=body, cookies=other.cookies, timeout=10).status_code == 403  # another login
        assert engine.busy and not job.done()
        job.cancel()  # the owner's own cancel goes through
        deadline = time.time() + 10
        while engine.busy:
            assert time.time() < deadline
            time.sleep(0.02)
    finally:
        demo.close()


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
