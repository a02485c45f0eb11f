"""What a first visitor and a red team tripped over: the API contract, files from a
cache root outside the temp dir, bounded exports, login backoff, cancel ownership, text shown as typed,
stopped replies keeping their stats, the page header, warm-up timings that make sense."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from gradio_client import Client
from PIL import Image
from support.app import SIZES, free_port

import ui
from neuron_backend.demo_models import DEMO_DIR_NAME
from neuron_backend.exports import ExportFolder
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.warmup import HIT_SUFFIX, READY, Step, Task, TimingHistory, WarmupRunner
from ui.guards import LoginThrottle
from ui.presentation import markdown_literal, markdown_unliteral, size_choice_label
from ui.status_panel import engine_chips, header_html, task_rows


def _backend(root: Path, demo_models, *extra) -> Backend:
    """A warm backend on the tiny models under ``root`` (the session's demo models linked in)."""
    (root / DEMO_DIR_NAME).parent.mkdir(parents=True, exist_ok=True)
    if not (root / DEMO_DIR_NAME).exists():
        (root / DEMO_DIR_NAME).symlink_to(demo_models.chat.parent, target_is_directory=True)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--sizes", SIZES,
                               "--port", str(free_port()), "--max-new-tokens", "200", *extra], env={})
    backend = Backend(settings)
    backend.runner.run()
    return backend


@pytest.fixture
def home_root():
    """A cache root outside both the working directory and the temp dir (as the default ~/.cache is)."""
    root = Path.home() / f".showcase-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


# ----- the served app -----------------------------------------------------------------------------
@pytest.mark.slow
def test_images_come_back_from_a_cache_root_outside_cwd_and_tmp(home_root, demo_models):
    """Gradio serves files only from cwd, the temp dir and allowed_paths."""
    backend = _backend(home_root, demo_models, "--no-chat")
    assert backend.served_folders() == [home_root / "outputs", home_root / "exports"]
    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)
    try:
        path, params = Client(url, verbose=False).predict("a lighthouse", api_name="/generate_image")
        assert Image.open(path).size == (64, 64) and params["size"] == "64x64"
        saved = backend.engine("image").outputs.saved_files()
        assert saved and saved[-1].parent == home_root / "outputs"
        allowed = {str(Path(p)) for p in demo.allowed_paths}
        assert allowed == {str(home_root / "outputs"), str(home_root / "exports")}  # nothing wider
    finally:
        demo.close()


@pytest.mark.slow
def test_api_pages_show_the_real_contract_and_accept_the_minimal_calls(tmp_path, demo_models):
    """Typed parameters with defaults; only the prompt / the message is required."""
    backend = _backend(tmp_path, demo_models)
    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(url, verbose=False)
        api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        image = {p["parameter_name"]: p for p in api["/generate_image"]["parameters"]}
        assert [n for n, p in image.items() if not p["parameter_has_default"]] == ["prompt"]
        assert image["size"]["parameter_default"] == "64x64"
        assert image["size"]["python_type"]["type"] == "Literal['64x64', '96x64']"
        assert image["steps"]["parameter_default"] == backend.settings.default_steps
        assert image["steps"]["python_type"]["type"] == "int"
        assert image["seed"]["parameter_default"] is None and image["guidance"]["parameter_default"] is None
        chat = api["/chat"]["parameters"]
        assert [p["parameter_name"] for p in chat if not p["parameter_has_default"]] == ["message"]
        assert "answer: str" in api["/chat"]["returns"][0]["python_type"]["type"]
        status_type = api["/status"]["returns"][0]["python_type"]["type"]
        assert status_type != "Any" and "ready: bool" in status_type and "eta_s: None | float" in status_type

        path, params = client.predict("a cat", api_name="/generate_image")  # a prompt, nothing else
        assert Image.open(path).size == (64, 64)
        assert params["steps"] == backend.settings.default_steps and 0 <= params["seed"] < 2**32
        assert client.predict("hello", api_name="/chat")["done"]  # a message, nothing else
    finally:
        demo.close()


def _login(url: str, password: str, client: httpx.Client | None = None) -> httpx.Response:
    post = (client or httpx).post
    return post(f"{url}login", data={"username": "ada", "password": password}, timeout=10)


@pytest.mark.slow
def test_repeated_login_failures_get_refused_until_the_window_passes(tmp_path, demo_models):
    """20 wrong passwords from one client: after 5 each further try waits, doubling."""
    backend = _backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image")
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
        while throttle.retry_after("127.0.0.1") > 0:  # the lock's own clock, not a guessed sleep
            assert time.monotonic() < deadline
            time.sleep(throttle.retry_after("127.0.0.1"))
        assert _login(url, "lovelace").status_code == 200  # after the window the right password works
        assert throttle.retry_after("127.0.0.1") == 0 and _login(url, "wrong").status_code == 400  # forgotten
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
    backend = _backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image", "--context-length", "4096",
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


# ----- exports ------------------------------------------------------------------------------------
def test_export_folder_is_bounded_and_cleaned(tmp_path):
    """Exports no longer pile up in the temp dir."""
    folder = ExportFolder(tmp_path / "exports", limit=3, max_bytes=10_000)
    paths = [folder.write(f"export {i}", ".md", "conversation") for i in range(5)]
    assert [p.read_text() for p in folder.files()] == ["export 2", "export 3", "export 4"]
    assert paths[-1].name.startswith("conversation-") and paths[-1].suffix == ".md"
    big = folder.write(b"x" * 9_000, ".bin")
    assert folder.files()[-1] == big and sum(p.stat().st_size for p in folder.files()) <= 10_000
    png = folder.write_png(Image.new("RGB", (8, 8)))
    assert Image.open(png).size == (8, 8)
    old = tmp_path / "exports" / "conversation-old.md"
    old.write_text("left by an earlier run")
    stale = time.time() - 3 * 24 * 3600
    os.utime(old, (stale, stale))
    ExportFolder(tmp_path / "exports", max_age_s=24 * 3600)  # a new start removes it
    assert not old.exists() and png.exists()


# ----- chat text and stopped replies ---------------------------------------------------------------
LITERAL = ["List<String>", "if a<b and c>d", "<unknown-tag>inside</unknown-tag>",
           '<div style="background-image:url(http://127.0.0.1:9/x)">x</div>', "AT&T &amp; co", "a \\<b> c \\\\<d",
           "code `List<T>` and\n```java\nList<String> x;\n```\nafter <b>", "```\nunclosed <a href=x>"]


@pytest.mark.parametrize("text", LITERAL)
def test_chat_text_is_escaped_outside_code_and_round_trips(text):
    escaped = markdown_literal(text)
    assert markdown_unliteral(escaped) == text
    outside = escaped.split("```")[0].split("`")[0]
    assert "<" not in outside.replace("\\<", "") and "&" not in outside.replace("\\&", "")


def test_chatbot_sends_escaped_text_and_hands_back_the_original():
    from ui.chat_tab import LiteralChatbot

    bot = LiteralChatbot(render=False)
    sent = bot.postprocess([{"role": "user", "content": "List<String>  \n    indented"}])
    assert sent.root[0].content[0].text == "List\\<String>  \n    indented"  # no cleandoc, nothing live
    back = bot.preprocess(sent)
    assert back[0]["content"][0]["text"] == "List<String>  \n    indented"


def test_a_stopped_reply_keeps_its_stats(tmp_path, demo_models):
    """Closing the reply (Gradio's Stop) still yields the final stats, marked stopped."""
    from neuron_backend.chat.text import ChatRequest
    from ui.chat_tab import StoppedReplies

    backend = _backend(tmp_path, demo_models, "--no-image")
    replies = StoppedReplies(backend)
    stream = replies.stream("session-1", ChatRequest(message="long story", greedy=True, max_new_tokens=200))
    first = [next(stream) for _ in range(3)]
    assert not first[-1].done
    stream.close()  # what Gradio does on Stop
    final = replies.stopped("session-1")
    assert final is not None and final.done and final.stats.stopped and final.stats.finish_reason == "stopped"
    assert 1 <= final.stats.new_tokens < 200 and final.answer.startswith(first[-1].answer)
    assert not backend.engine("chat").busy
    assert replies.stopped("session-1") is None  # shown once
    assert replies.stopped("another session") is None


@pytest.mark.slow
def test_a_stopped_reply_keeps_its_stats_with_chat_batch_and_the_other_reply_runs_on(tmp_path, demo_models):
    """With --chat-batch 2, Stop ends only that reply's row: it keeps its stats, the other user's reply goes on."""
    from neuron_backend.chat.batch import BatchRow, Sampling
    from neuron_backend.chat.text import ChatRequest
    from ui.chat_tab import StoppedReplies

    backend = _backend(tmp_path, demo_models, "--no-image", "--chat-batch", "2", "--max-new-tokens", "2000")
    replies = StoppedReplies(backend)
    # 2000 tokens: a few seconds on the demo model, so the stop lands mid-reply (200 could end before it)
    request = ChatRequest(message="long story", greedy=True, max_new_tokens=2000)
    mine, theirs = replies.stream("me", request), replies.stream("them", request)
    # Both submitted at once, so they share one batch (a request that comes while a batch runs waits for it).
    started = threading.Thread(target=next, args=(theirs,))
    started.start()
    first = [next(mine) for _ in range(3)]
    started.join(10)
    assert not first[-1].done
    mine.close()  # what Gradio does on Stop
    final = replies.stopped("me")
    assert final is not None and final.done and final.stats.stopped and final.stats.finish_reason == "stopped"
    assert 1 <= final.stats.new_tokens < 2000 and final.stats.batch_size == 2
    rest = list(theirs)  # the other reply ran on to its own end, in the same batch
    assert rest[-1].done and rest[-1].stats.batch_size == 2 and not rest[-1].stats.stopped
    assert rest[-1].stats.new_tokens > final.stats.new_tokens
    # A row stopped before its turn ends with a result (no tokens), not a wait for a batch that never comes.
    scheduler = backend.engine("chat")._scheduler()
    row = BatchRow([1, 2, 3], 32, 5, Sampling(greedy=True))
    row.cancel.set()
    scheduler.submit(row)
    assert list(scheduler.follow(row)) == [] and row.result.finish_reason == "stopped" and row.result.new_ids == []


# ----- the header and the warm-up table ---------------------------------------------------------------
def test_header_has_title_chips_and_the_demo_notice(tmp_path, demo_models):
    backend = _backend(tmp_path, demo_models)
    status = backend.status()
    assert engine_chips(status) == [("ready", "Chat · demo Qwen3 (tiny) · cpu · ready"),
                                    ("ready", "Image · demo FLUX.2-klein (tiny) · cpu · ready")]
    page = header_html(status)
    assert "<h1" in page and "Hugging Face models on AWS Trainium" in page
    assert 'id="demo-notice"' in page and "noise" in page and "--models tiny" in page
    assert 'id="warmup-state"' in page
    status["demo"] = False
    assert 'id="demo-notice"' not in header_html(status)
    status["tasks"][-1]["state"] = "queued"
    assert engine_chips(status)[1][0] == "warming up"


def test_queued_tasks_show_expectations_in_the_state_not_the_seconds_column():
    task = {"name": "image · size 64x64", "shape": "64x64", "state": "queued", "seconds": None, "cache_hit": None,
            "error": None, "expected_s": 12.0, "progress": None, "detail": None}
    row = task_rows({"tasks": [task]})[0]
    assert row[3] == "" and "expected 12 s" in row[2]

    from neuron_backend.shapes import parse_size

    size = parse_size("64x64")  # only the running task compiles: the others say they wait
    assert size_choice_label(size, {"state": "queued", "eta_s": 30.0}).endswith("· queued, ~30 s")
    assert size_choice_label(size, {"state": "running", "eta_s": 3.0}).endswith("· compiling, ~3.0 s")


# ----- timing history ------------------------------------------------------------------------------
def test_timing_history_ignores_values_that_make_no_sense(tmp_path):
    """Negative, NaN, infinite, huge or non-numeric durations are not learned."""
    path = tmp_path / "warmup-history.json"
    path.write_text(json.dumps({"ok": 12.5, "negative": -9e9, "huge": 1e12, "text": "x", "flag": True,
                                "nested": {"a": 1}}).replace("12.5", "12.5, \"nan\": NaN, \"inf\": Infinity"))
    history = TimingHistory(path)
    assert history.get("ok") == 12.5
    for key in ("negative", "huge", "text", "flag", "nested", "nan", "inf"):
        assert history.get(key) is None, key
    history.record("ok", -1.0)
    history.record("ok", math.nan)
    assert history.get("ok") == 12.5
    (tmp_path / "list.json").write_text("[1, 2]")
    assert TimingHistory(tmp_path / "list.json").problem  # not an object: start afresh, say so


def _runner(history: TimingHistory, names: list[str]) -> WarmupRunner:
    steps = [Step(Task(name, "image", "compile", name), lambda task: None, name) for name in names]
    return WarmupRunner(steps, history)


def test_cold_and_cache_hit_durations_are_learned_apart(tmp_path):
    """A warm restart's ETA comes from cache-hit durations, not from the cold start's."""
    history = TimingHistory(tmp_path / "h.json")
    history.record("a", 100.0, cache_hit=False)
    history.record("a", 10.0, cache_hit=True)
    assert history.get("a") == 100.0 and history.get("a", cache_hit=True) == 10.0
    assert history._data == {"a": 100.0, "a" + HIT_SUFFIX: 10.0}
    assert _runner(history, ["a"]).tasks[0].expected_s == 10.0  # it hit before: it will hit again

    # Only cold times known (the first restart after a cold start): once one task hits, the ratio
    # it shows scales the others' cold times.
    cold = TimingHistory(tmp_path / "cold.json")
    cold.record("x", 50.0)
    cold.record("y", 100.0)
    runner = _runner(cold, ["x", "y"])
    assert runner.snapshot()["eta_s"] == pytest.approx(150.0)
    x = runner.tasks[0]
    x.state, x.seconds, x.cache_hit = READY, 5.0, True
    assert runner.snapshot()["eta_s"] == pytest.approx(10.0)  # y: 100 s cold x (5 / 50)


# ----- demo model folders ------------------------------------------------------------------------------
def test_a_failed_image_demo_build_leaves_chat_working(tmp_path, monkeypatch):
    """Each engine's demo model is built on its own (a full disk spares chat)."""
    from neuron_backend import demo_models
    from neuron_backend.chat.text import ChatRequest

    def disk_full(folder):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(demo_models, "build_tiny_image_pipeline", disk_full)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--sizes", SIZES],
                              env={})
    backend = Backend(settings)
    backend.runner.run()
    status = backend.status()
    assert status["engines"]["chat"]["state"] == "ready", status["engines"]
    assert status["engines"]["image"]["state"] == "failed"
    reason = status["engines"]["image"]["reason"]
    assert "No space left on device" in reason and "rebuild" in reason
    assert list(backend.stream_chat(ChatRequest(message="hi", max_new_tokens=2)))[-1].done


def test_a_corrupt_demo_folder_is_rebuilt(tmp_path, demo_models):
    """A garbled config or truncated weights no longer fail every start."""
    from neuron_backend.demo_models import ensure_demo_models

    shutil.copytree(demo_models.chat.parent, tmp_path / DEMO_DIR_NAME)
    models = ensure_demo_models(tmp_path)
    (models.image / "model_index.json").write_text("garbage{")
    weights = next(models.chat.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    ensure_demo_models(tmp_path)
    json.loads((models.image / "model_index.json").read_text())
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--sizes", "64x64"],
                              env={})
    backend = Backend(settings)
    backend.runner.run()
    assert {e["state"] for e in backend.status()["engines"].values()} == {"ready"}
