"""A hostile remote: a chat server that ignores max_tokens, sends one huge chunk or redirects the conversation, an
image worker whose /readyz is huge. The remote engines read at most their caps, follow no redirect, and end the
reply with an error that says why (loopback only; the fake server is a Starlette app on a free port)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from support.app import app_settings, free_port

from neuron_backend.errors import EngineUnavailableError
from tools.remote import bounded
from tools.remote.chat import RemoteChatEngine
from tools.remote.image import RemoteImageEngine, Worker
from tools.remote.plugin import servers

pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

MAX_EVENTS = 20_000  # the endless reply's own bound: a test never streams forever
HUGE_CHUNK_BYTES = 8 << 20  # one event's text, far over the cap of a 16-token reply (reply_bytes(16) is 288 KiB)


def _event(text: str) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Hostile:
    """The fake server: its URL, the paths it was asked for, and how many events it sent."""

    def __init__(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
        from starlette.routing import Route

        self.asked: list[str] = []
        self.sent = 0

        async def models(request):
            self.asked.append(request.url.path)
            return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "x"}]})

        async def chat(request):
            self.asked.append(request.url.path)
            mode = request.path_params["mode"]
            if mode == "redirect":
                return RedirectResponse(f"{self.url}/elsewhere/v1/chat/completions", status_code=307)

            async def endless():
                for _ in range(MAX_EVENTS):
                    self.sent += 1
                    yield _event("word ")
                    await asyncio.sleep(0)

            async def huge():
                self.sent += 1
                yield _event("x" * HUGE_CHUNK_BYTES)

            return StreamingResponse(endless() if mode == "endless" else huge(), media_type="text/event-stream")

        async def readyz(request):
            self.asked.append(request.url.path)
            padding = "x" * (4 << 20)  # valid JSON that lists a ready shape, 4 MB of it
            body = {"shapes": {"image": {"64x64": {"state": "ready"}}}, "padding": padding}
            return Response(json.dumps(body), media_type="application/json")

        app = Starlette(routes=[Route("/{mode}/v1/models", models), Route("/{mode}/v1/chat/completions", chat,
                                                                              methods=["POST"]),
                                Route("/readyz", readyz)])
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the fake server did not start"
            time.sleep(0.01)

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def hostile():
    server = Hostile()
    yield server
    server.close()


def _engine(tmp_path, url: str) -> RemoteChatEngine:
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-image",
                             "--chat-server", url, "--max-new-tokens", "200"])
    engine = RemoteChatEngine(settings, servers(settings).chat)
    engine.connect()
    return engine


def test_a_server_that_ignores_max_tokens_is_cut_at_the_replys_budget(hostile, tmp_path):
    engine = _engine(tmp_path, hostile.url + "/endless/v1")
    updates = engine.stream({"message": "hi", "greedy": True, "max_new_tokens": 16})
    pieces = []
    with pytest.raises(EngineUnavailableError, match=r"kept sending past the 16 tokens this reply may have \(it "
                                                     r"ignores max_tokens\), so the reply was cut there"):
        for update in updates:
            pieces.append(update.delta)
    assert len(pieces) == 16 and "".join(pieces).split() == ["word"] * 16
    assert hostile.sent < MAX_EVENTS  # the app hung up; the server did not run out


def test_one_huge_chunk_is_never_read_whole(hostile, tmp_path):
    engine = _engine(tmp_path, hostile.url + "/huge/v1")
    with pytest.raises(EngineUnavailableError, match="kept sending past the 16 tokens") as refused:
        list(engine.stream({"message": "hi", "greedy": True, "max_new_tokens": 16}))
    assert "xxxx" not in str(refused.value)


def test_a_redirect_is_refused_never_followed(hostile, tmp_path):
    engine = _engine(tmp_path, hostile.url + "/redirect/v1")
    with pytest.raises(EngineUnavailableError, match=r"answered 307, a redirect to .*/elsewhere/v1/chat/completions"
                                                     r"; this app does not follow redirects"):
        list(engine.stream({"message": "a secret", "greedy": True, "max_new_tokens": 16}))
    assert not any(path.startswith("/elsewhere") for path in hostile.asked)


def test_a_workers_huge_readyz_is_not_read_past_the_cap(hostile, tmp_path):
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-chat",
                             "--image-server", hostile.url, "--sizes", "64x64"])
    engine = RemoteImageEngine(settings, servers(settings).images)
    with pytest.raises(OSError, match=f"passed {bounded.MAX_BODY_BYTES} bytes"):
        engine._look(Worker(hostile.url))
    assert "/readyz" in hostile.asked
