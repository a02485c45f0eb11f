"""--chat-server: the chat engine as a client of an OpenAI-compatible server, here this app's own /v1 on the tiny
models (the session's warm app, on loopback). The same request gives the same reply through the server as from
the engine itself, token for token; a stop frees the server; refusals, a wrong key, an unreachable server and a
server that drops the connection mid-reply each end in a typed error that names the fix."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from support.app import app_backend, app_parts, app_settings, free_port, slowed, start_app

from neuron_backend import devices
from neuron_backend.errors import ConfigError, EngineUnavailableError, InvalidRequestError
from neuron_backend.plugins import Parts
from neuron_backend.runtime import Backend
from tools.remote import chat as remote
from tools.remote.plugin import servers

pytest.importorskip("openai")

SHAPES = ("--chat-buckets", "32,64,128", "--context-length", "256", "--max-new-tokens", "200")


def front_backend(root, url: str, *extra) -> Backend:
    """A chat-only app whose chat runs at ``url`` (no model of its own), warmed up: connected."""
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--no-image",
                             "--chat-server", url, *SHAPES, *extra])
    backend = app_backend(settings, host=devices.HostDevices(neuron_cores=0, cuda_devices=0))
    backend.runner.run()
    return backend


def test_the_chat_runs_elsewhere_only_through_the_plug_ins_parts(tmp_path):
    # The core knows no --chat-server: the flag is the plug-in's, and its parts place the chat on the server
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-image",
                             "--chat-server", "http://127.0.0.1:9/v1", *SHAPES])
    host = devices.HostDevices(neuron_cores=0, cuda_devices=0)
    assert Backend(settings, host).placements["chat"].kind == "cpu"
    there = Backend(settings, host, app_parts(settings)).placements["chat"]
    assert (there.kind, there.label()) == ("remote", "http://127.0.0.1:9/v1 · OpenAI-compatible server")
    with pytest.raises(ValueError, match="no remote"):  # engines elsewhere with nothing to connect them
        Backend(settings, host, Parts(elsewhere=app_parts(settings).elsewhere))


@pytest.fixture(scope="module")
def pair(warm_app, tmp_path_factory):
    """(the worker's backend, a front backend whose chat is the worker's /v1)."""
    worker, url = warm_app
    return worker, front_backend(tmp_path_factory.mktemp("front"), url + "v1")


def _final(updates) -> tuple:
    updates = list(updates)
    return updates[-1], "".join(u.delta for u in updates), len(updates)


def _message_of(engine, tokens: int) -> str:
    for n in range(1, 4 * tokens):
        if engine.count_prompt_tokens({"message": "x" * n}).prompt_tokens == tokens:
            return "x" * n
    raise AssertionError(f"no message of {tokens} prompt tokens")


REQUESTS = [
    {"message": "hello there", "greedy": True, "max_new_tokens": 24},  # a short prompt in the first bucket
    {"message": 32, "greedy": True, "max_new_tokens": 16},  # a prompt of exactly 32 tokens: fills bucket 32
    {"message": 33, "greedy": True, "max_new_tokens": 16},  # one token over: bucket 64
    {"message": "tell me more", "greedy": True, "max_new_tokens": 20, "system_prompt": "Be brief.",
     "history": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {"message": "think first", "greedy": True, "thinking": True, "max_new_tokens": 30},
    {"message": "sample me", "temperature": 0.9, "top_p": 0.9, "top_k": 20, "seed": 7, "max_new_tokens": 20},
]


@pytest.mark.parametrize("request_", REQUESTS,
                         ids=["short", "fills-bucket", "bucket-plus-one", "history", "thinking", "sampled"])
def test_a_reply_through_the_server_is_the_engines_own_token_for_token(pair, request_):
    worker, front = pair
    if isinstance(request_["message"], int):  # a prompt of that many tokens, template included
        request_ = {**request_, "message": _message_of(worker.engine("chat"), request_["message"])}
    local, local_text, _ = _final(worker.stream_chat(dict(request_)))
    there, there_text, count = _final(front.stream_chat(dict(request_)))
    assert (there.reasoning, there.answer) == (local.reasoning, local.answer)
    assert there_text == local_text == local.reasoning + local.answer  # the deltas add up to the reply
    assert count > 2  # streamed, not one block at the end
    a, b = there.stats, local.stats
    assert (a.prompt_tokens, a.new_tokens, a.finish_reason, a.seed) == (b.prompt_tokens, b.new_tokens,
                                                                        b.finish_reason, b.seed)
    assert a.bucket == 0 and a.context_length == 256 and a.compiled_graphs == 0 and not a.stopped


def test_the_front_says_where_its_chat_runs(pair):
    worker, front = pair
    status = front.status()
    url = servers(front.settings).chat
    assert status["engines"]["chat"]["state"] == "ready" and status["ready"]
    assert status["engines"]["chat"]["placement"] == f"{url} · OpenAI-compatible server"
    assert front.engine("chat").model == worker.settings.chat_model  # the name the server serves it under
    assert str(front.model_id("chat")) == "demo Qwen3 (tiny, random weights)"  # as the server says it runs
    assert [t.name for t in front.runner.tasks] == [f"chat · connect to {url}"]
    assert front.runner.tasks[0].detail == f"{worker.settings.chat_model} at {url}"
    assert url in front.banner()
    from tools.openai_api.routes import OpenAIRoutes

    listed = OpenAIRoutes(front).describe_model("chat")  # the front's own /v1/models entry
    assert listed["demo"] and listed["context_length"] == 256 and "buckets" not in listed, listed  # the server's
    assert status["demo"] and status["models_reason"] == "the servers this page uses run demo models"


def test_a_stop_ends_the_reply_at_once_and_frees_the_server(pair):
    worker, front = pair
    engine, stop = worker.engine("chat"), threading.Event()
    with slowed(engine, 0.05):  # 200 tokens would take over 10 s
        updates = front.stream_chat({"message": "go on", "greedy": True, "max_new_tokens": 200}, stop)
        first = next(updates)
        stop.set()
        stopped_at = time.monotonic()
        final = list(updates)[-1]
        assert time.monotonic() - stopped_at < 2.0
        assert final.done and final.stats.stopped and final.stats.finish_reason == "stopped"
        assert final.answer.startswith(first.answer)
        deadline = time.monotonic() + 5.0
        while engine.busy and time.monotonic() < deadline:  # the worker hears the closed stream
            time.sleep(0.05)
        assert not engine.busy, "the worker still generates a reply nobody reads"


def test_cancel_stops_the_reply_that_streams_now(pair):
    """The Chat tab's Stop (one reply at a time) cancels the engine, not a reply's own event."""
    worker, front = pair
    with slowed(worker.engine("chat"), 0.05):
        updates = front.stream_chat({"message": "go on", "greedy": True, "max_new_tokens": 200})
        next(updates)
        assert front.cancel("chat")
        cancelled_at = time.monotonic()
        final = list(updates)[-1]
        assert time.monotonic() - cancelled_at < 2.0 and final.stats.finish_reason == "stopped"
    assert not front.cancel("chat")  # nothing streams any more


def test_the_servers_refusal_reaches_the_user_in_its_words(pair):
    _, front = pair
    with pytest.raises(InvalidRequestError, match="128"):  # over the worker's largest bucket: its own message
        list(front.stream_chat({"message": "word " * 400, "greedy": True}))
    with pytest.raises(InvalidRequestError, match="empty"):  # checked here first, with the same limits
        list(front.stream_chat({"message": "   "}))


@pytest.mark.slow
def test_a_server_with_a_key_needs_it(tmp_path_factory, monkeypatch):
    demo, worker, url = start_app(tmp_path_factory.mktemp("keyed"), "--no-image", "--api-key", "sk-remote-1")
    try:
        refused = front_backend(tmp_path_factory.mktemp("nokey"), url + "v1")
        assert refused.engine_states()["chat"] == "failed"
        assert "--chat-server-key" in refused.runner.tasks[0].error
        keyed = front_backend(tmp_path_factory.mktemp("key"), url + "v1", "--chat-server-key", "sk-remote-1")
        final, _, _ = _final(keyed.stream_chat({"message": "hi", "greedy": True, "max_new_tokens": 4}))
        assert final.stats.new_tokens == 4
    finally:
        demo.close()


@pytest.mark.slow
def test_an_unreachable_server_fails_its_warm_up_task_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "GIVE_UP_S", 1.0)
    monkeypatch.setattr(remote, "POLL_S", 0.2)
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    started = time.monotonic()
    front = front_backend(tmp_path, url)
    assert time.monotonic() - started < 10
    task = front.runner.tasks[0]
    assert task.state == "failed" and url in task.error and "--chat-server" in task.error
    assert front.engine_states()["chat"] == "failed" and not front.status()["ready"]
    with pytest.raises(EngineUnavailableError, match="failed to load"):
        list(front.stream_chat({"message": "hi"}))


def test_a_server_that_drops_the_connection_mid_reply_ends_in_an_error(pair):
    """A worker that dies after its first token: the reply raises a typed error naming the server, no hang."""
    _, front = pair
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    chunk = ('data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,'
             '"delta":{"content":"half a"},"finish_reason":null}]}\n\n')

    def serve_once():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                         + f"{len(chunk):x}\r\n{chunk}\r\n".encode())
            time.sleep(0.2)  # then the process dies: the connection closes mid-body

    server = threading.Thread(target=serve_once, daemon=True)
    server.start()
    engine = front.engine("chat")
    dying = remote.RemoteChatEngine(front.settings, f"http://127.0.0.1:{port}/v1")
    dying.model = engine.model
    updates = dying.stream({"message": "hi", "greedy": True})
    assert next(updates).answer == "half a"
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError, match=f"127.0.0.1:{port}"):
        list(updates)
    assert time.monotonic() - started < 5
    server.join(5)
    listener.close()


def test_chat_server_flags_are_checked():
    base = ["--models", "tiny", "--device", "cpu"]
    for bad in ("localhost:8000", "ftp://host/v1", "http://"):
        with pytest.raises(ConfigError, match="--chat-server"):
            servers(app_settings([*base, "--chat-server", bad]))
    with pytest.raises(ConfigError, match="--no-chat"):
        servers(app_settings([*base, "--chat-server", "http://127.0.0.1:8000/v1", "--no-chat"]))
    settings = app_settings([*base, "--chat-server", "http://127.0.0.1:8000/v1/", "--chat-server-key", "k3y"])
    assert servers(settings).chat == "http://127.0.0.1:8000/v1" and "k3y" not in repr(servers(settings))
    assert "k3y" not in repr(settings)  # the plug-ins' flags are not in the settings' repr either
    asked = []
    app_settings(["--models", "auto", "--chat-server", "http://127.0.0.1:8000/v1"],
                 weights_available=lambda model, timeout: asked.append(model) or (True, "cached"))
    assert asked == ["black-forest-labs/FLUX.2-klein-4B"]  # the chat's weights are the server's business



def test_the_context_meter_shows_the_servers_context(pair):
    from ui.presentation import context_meter_text

    _, front = pair
    final, _, _ = _final(front.stream_chat({"message": "hello", "greedy": True, "max_new_tokens": 5}))
    used = final.stats.prompt_tokens + 5
    assert context_meter_text(final.stats, (32, 64, 128), 999) == \
        f"Context: prompt {final.stats.prompt_tokens} tokens · {used}/256 tokens on the chat server"


@pytest.mark.slow
def test_a_server_still_warming_up_is_waited_for_with_its_progress(tmp_path_factory, monkeypatch):
    """The front's connect task shows how far the server's warm-up is (its shapes ready) and ends once it serves."""
    monkeypatch.setattr(remote, "POLL_S", 0.2)
    demo, worker, url = start_app(tmp_path_factory.mktemp("warming"), "--no-image", warm=False)  # last bucket queued
    try:
        settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir",
                                 str(tmp_path_factory.mktemp("front")), "--no-image", "--chat-server", url + "v1",
                                 *SHAPES])
        front = app_backend(settings, host=devices.HostDevices(neuron_cores=0, cuda_devices=0))
        connecting = threading.Thread(target=front.runner.run)
        connecting.start()
        task, deadline = front.runner.tasks[0], time.monotonic() + 30
        while "warming up" not in (task.detail or "") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (task.state, task.progress, task.detail) == (
            "running", 2 / 3, f"the chat server at {url}v1 is warming up: 2/3 shapes ready")
        worker.runner._run_step(worker.runner._steps[-1])  # the last bucket warms up: the server serves
        connecting.join(30)
        assert not connecting.is_alive() and (task.state, task.progress) == ("ready", 1.0)
    finally:
        demo.close()


@pytest.mark.slow
def test_the_pages_queue_lets_replies_stream_together_to_the_server(tmp_path_factory):
    """Through the page's Gradio queue: with a slot for one reply (its own --chat-batch 1), every visitor's reply
    waited for the one streaming, and a server that batches (vLLM, or this app with --chat-batch 2) got one at a
    time. A page with --chat-server lets up to --queue-size replies stream to it at once."""
    from gradio_client import Client

    root = tmp_path_factory.mktemp("batching")
    server = start_app(root / "server", "--no-image", "--chat-batch", "2")
    page = start_app(root / "page", "--no-image", "--chat-server", server[2] + "v1")
    streaming, most, stream_chat = [], [0], page[1].stream_chat

    def counted(request, stop=None):  # the page's replies in flight to the server, from request to last update
        streaming.append(1)
        most[0] = max(most[0], len(streaming))
        try:
            yield from stream_chat(request, stop)
        finally:
            streaming.pop()

    page[1].stream_chat = counted
    try:
        with slowed(server[1].engine("chat"), 0.05):
            jobs = [Client(page[2], verbose=False).submit(message=f"long story {i}", max_new_tokens=60, greedy=True,
                                                          api_name="/chat") for i in range(2)]
            deadline = time.monotonic() + 60
            while not all(job.done() for job in jobs) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert most[0] == 2, "the page sent its replies to the chat server one at a time"
        assert all(job.result()["done"] for job in jobs)
    finally:
        page[0].close()
        server[0].close()
