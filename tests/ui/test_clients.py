"""Probes, Prometheus metrics, saved chats and feedback, each with a real client on loopback.

- HTTP probes and metrics scraped during warm-up (one size held back) and after it (``httpx``).
- Saved chats and 👍/👎 feedback in headless Chromium (skipped without the browser, like
  tests/browser/test_browser.py); the feedback file is then read by the QA bench's own parser.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
from support.app import SIZES, start_app

from tools.qa.feedback import FeedbackLog
from tools.qa.inputs import parse_prompt_set

AUTH = ("ada", "lovelace")
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _metric(text: str, name: str, **labels) -> float | None:
    """The value of one sample in Prometheus text format (None when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = r"^" + re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "") + r" (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


# ----- probes and metrics -----------------------------------------------------------------------
@pytest.mark.slow
def test_probes_and_metrics_during_and_after_warm_up(tmp_path):
    demo, backend, url = start_app(tmp_path, warm=False)  # the last image size stays queued
    try:
        held = backend.runner._steps[-1]
        assert httpx.get(url + "healthz").status_code == 200
        during = httpx.get(url + "readyz")
        assert during.status_code == 503
        body = during.json()
        assert body["ready"] is False and body["warming"] == [held.task.name] and body["failed"] == []
        assert str(tmp_path) not in during.text  # no paths in the probe's body
        metrics = httpx.get(url + "metrics")
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        assert _metric(metrics.text, "showcase_warmup_tasks", state="queued") == 1
        assert _metric(metrics.text, "showcase_engine_state", engine="image", state="ready") == 1
        assert _metric(metrics.text, "showcase_queue_depth") == 0

        backend.runner._run_step(held)  # warm-up of the last size ends
        after = httpx.get(url + "readyz")
        assert after.status_code == 200 and after.json()["ready"] is True and after.json()["warming"] == []

        from gradio_client import Client

        client = Client(url, verbose=False)
        client.predict(prompt="a lighthouse", size=SIZES.split(",")[0], steps=1, seed=3, guidance=None,
                       api_name="/generate_image")
        with pytest.raises(Exception, match="Allowed sizes"):
            client.predict(prompt="a lighthouse", size="512x512", steps=1, seed=3, guidance=None,
                           api_name="/generate_image")
        update = list(client.submit(message="Hello", max_new_tokens=8, greedy=True, api_name="/chat"))[-1]
        assert update is not None and update["done"]
        text = httpx.get(url + "metrics").text
        assert _metric(text, "showcase_requests_total", endpoint="image", outcome="ok") == 1
        assert _metric(text, "showcase_requests_total", endpoint="image", outcome="rejected") == 1
        assert _metric(text, "showcase_requests_total", endpoint="chat", outcome="ok") == 1
        assert _metric(text, "showcase_image_seconds_count", size="64x64") == 1
        assert _metric(text, "showcase_chat_time_to_first_token_seconds_count") == 1
        assert _metric(text, "showcase_chat_new_tokens_total") == update["stats"]["new_tokens"]
        assert _metric(text, "showcase_warmup_tasks", state="ready") == len(backend.runner.tasks)
        # The task's series keep their labels through its transitions: its state is a 0/1 series per state.
        assert _metric(text, "showcase_warmup_task_seconds", engine="image", kind="compile",
                       shape=held.task.shape) is not None
        assert _metric(text, "showcase_warmup_task_state", engine="image", kind="compile", shape=held.task.shape,
                       state="ready") == 1
        assert _metric(text, "showcase_compiles_since_ready") is not None
        assert _metric(text, "showcase_requests_in_progress", endpoint="chat") == 0
    finally:
        demo.close()


@pytest.mark.slow
def test_readyz_per_shape_on_a_partly_warm_server(tmp_path, monkeypatch):
    from neuron_backend.chat.engine import ChatEngine
    from neuron_backend.shapes import PromptBucket

    warm_up = ChatEngine.warm_up

    def flaky(self, shape):  # the largest prompt bucket fails to compile; the other two serve
        if shape == PromptBucket(128):
            self.shapes.mark_failed(shape, "simulated compiler crash in /opt/neuron")
            raise RuntimeError("simulated compiler crash in /opt/neuron")
        return warm_up(self, shape)

    monkeypatch.setattr(ChatEngine, "warm_up", flaky)
    demo, backend, url = start_app(tmp_path, warm=False)  # the last image size stays queued (30 s expected)
    try:
        def ask(method="GET", **params) -> httpx.Response:
            return httpx.request(method, url + "readyz", params=params)

        ready = ask(shape="64x64")
        assert ready.status_code == 200
        assert ready.json() == {"ready": True, "engine": "image", "shape": "64x64", "state": "ready", "eta_s": 0.0}
        assert ask(shape="prefill-32", engine="chat").json()["state"] == "ready"
        queued = ask(shape="96x64")
        assert queued.status_code == 503
        assert queued.json() == {"ready": False, "engine": "image", "shape": "96x64", "state": "queued",
                                 "eta_s": 30.0}
        failed = ask(shape="prefill-128")
        assert failed.status_code == 503
        assert failed.json() == {"ready": False, "engine": "chat", "shape": "prefill-128", "state": "failed",
                                 "eta_s": None}
        unknown = ask(shape="512x512")
        assert unknown.status_code == 404
        assert unknown.json()["detail"] == ("shape '512x512' is not declared on this server; declared shapes: "
                                            "chat: prefill-32, prefill-64, prefill-128; image: 64x64, 96x64.")
        assert [ask("HEAD", shape=s).status_code for s in ("64x64", "96x64", "prefill-128", "512x512")] == \
            [200, 503, 503, 404]
        assert ask("HEAD", shape="64x64").content == b""

        plain = ask()  # every key it had, the same 503, and the map of every shape
        assert plain.status_code == 503 and ask("HEAD").status_code == 503
        body = plain.json()
        assert set(body) == {"ready", "done", "total", "warming", "failed", "warnings", "shapes"}
        assert body["warming"] == [backend.runner._steps[-1].task.name] and len(body["failed"]) == 1
        ready_now = {"state": "ready", "eta_s": 0.0}
        assert body["shapes"] == {
            "chat": {"prefill-32": ready_now, "prefill-64": ready_now,
                     "prefill-128": {"state": "failed", "eta_s": None}},
            "image": {"64x64": ready_now, "96x64": {"state": "queued", "eta_s": 30.0}}}
        assert "simulated" not in plain.text and "/opt/neuron" not in plain.text and str(tmp_path) not in plain.text

        backend.runner._run_step(backend.runner._steps[-1])  # the last size ends its warm-up
        assert ask(shape="96x64").status_code == 200
        assert ask().status_code == 503  # prefill-128 still does not serve
    finally:
        demo.close()


# ----- feedback file ----------------------------------------------------------------------------
def test_feedback_file_is_bounded_and_is_a_qa_prompt_set(tmp_path, tiny_settings):
    log = FeedbackLog(tmp_path / "feedback", max_bytes=4000)
    first = log.record("up", "Say hi", "hi", {"temperature": 0.5, "seed": 7, "thinking": False, "top_k": 20,
                                              "system_prompt": None}, {"new_tokens": 1}, turn=1)
    log.record("down", "Count to 3", "1 2 4", {"greedy": True, "max_new_tokens": 16}, {"new_tokens": 5}, turn=2)
    assert log.comment(first, "friendly")
    assert [m["comment"] for m in log.marks()] == ["friendly", ""]
    rows = parse_prompt_set(file=log.prompt_set, settings=tiny_settings)
    assert [r.prompt for r in rows] == ["Count to 3", "Say hi"]  # disliked first
    assert rows[0].settings == {"greedy": True, "max_new_tokens": 16}
    assert rows[1].settings == {"temperature": 0.5, "seed": 7, "thinking": False, "top_k": 20}
    for i in range(40):  # ~150 bytes a row: the file rotates, the two files stay bounded
        log.record("down", f"prompt {i}", "x" * 50)
    assert log.rotated.exists() and log.path.stat().st_size <= 4000 and log.rotated.stat().st_size <= 4000
    assert len(parse_prompt_set(file=log.prompt_set, settings=tiny_settings)) == len(
        {m["prompt"] for m in log.marks()})
    with pytest.raises(Exception, match="rating"):
        log.record("meh", "p", "r")


# ----- saved chats and feedback in a browser ----------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def _send(page, text: str, bots: int) -> None:
    page.locator("#chat-tab textarea").first.fill(text)
    page.locator("#chat-tab textarea").first.press("Enter")
    page.wait_for_function("(n) => document.querySelectorAll('#chatbot .message-row.bot-row').length >= n "
                           "&& !document.querySelector('#chat-tab button.stop-button:not([style*=none])')"
                           " || false", arg=bots, timeout=60_000)


@pytest.mark.slow
def test_saved_chat_survives_reload_and_stays_in_its_browser(browser, tmp_path):
    demo, backend, url = start_app(tmp_path)
    try:
        first = browser.new_context()
        page = first.new_page()
        page.goto(url)
        _send(page, "Remember the lighthouse", 1)
        saved = page.locator("#chat-tab .table-wrap, #chat-tab table").filter(has_text="Remember the lighthouse")
        saved.first.wait_for(timeout=30_000)  # listed in the side panel
        page.reload()
        listed = page.get_by_text("Remember the lighthouse").first
        listed.wait_for(timeout=30_000)  # survives the reload (the browser's localStorage)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "saved-chats.png"), full_page=True)
        listed.click()  # reopen it
        page.locator("#chatbot .message-row.user-row").filter(has_text="Remember the lighthouse").wait_for()

        other = browser.new_context()  # another visitor: nothing of the first one's chats
        stranger = other.new_page()
        stranger.goto(url)
        stranger.locator("#chatbot").wait_for()
        stranger.get_by_role("button", name="New chat").wait_for()
        assert stranger.get_by_text("Remember the lighthouse").count() == 0

        page.locator("#chatbot button[aria-label='Clear']").first.click()  # deletes the open chat
        page.wait_for_function("() => !document.body.innerText.includes('Remember the lighthouse')")
        page.reload()
        page.get_by_role("button", name="New chat").wait_for()
        assert page.get_by_text("Remember the lighthouse").count() == 0
        other.close()
        first.close()
    finally:
        demo.close()


@pytest.mark.slow
def test_feedback_from_the_page_is_written_and_imported_by_the_qa_bench(browser, tmp_path):
    demo, backend, url = start_app(tmp_path)
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(url)
        _send(page, "Tell me about compilers", 1)
        page.locator("#chatbot .message-row.bot-row").last.hover()
        page.locator("#chatbot button[aria-label='Dislike']").last.click()
        page.locator("#feedback-comment textarea").fill("too short")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "feedback-comment.png"), full_page=True)
        page.locator("#feedback-save").click()
        page.locator("#feedback-row").wait_for(state="hidden")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "feedback.png"), full_page=True)
        log = FeedbackLog(tmp_path / "feedback")
        marks = log.marks()
        assert len(marks) == 1
        mark = marks[0]
        assert mark["rating"] == "down" and mark["comment"] == "too short"
        assert mark["prompt"] == "Tell me about compilers" and mark["turn"] == 1
        assert mark["stats"]["new_tokens"] >= 1 and mark["settings"]["max_new_tokens"] == 200
        rows = parse_prompt_set(file=log.prompt_set, settings=backend.settings)
        assert [r.prompt for r in rows] == ["Tell me about compilers"]
        assert rows[0].settings["max_new_tokens"] == 200 and rows[0].settings["top_k"] == 20
        scraped = httpx.get(url + "metrics").text
        assert _metric(scraped, "showcase_feedback_marks_total", rating="down") == 1
        context.close()
    finally:
        demo.close()


def test_feedback_rows_keep_only_qa_columns(tmp_path):
    log = FeedbackLog(tmp_path)
    log.record("up", "p", "r", {"temperature": 0.3, "not_a_setting": 1})
    assert json.loads(log.prompt_set.read_text()) == {"prompt": "p", "temperature": 0.3}


@pytest.mark.slow
def test_saved_chats_keep_their_key_and_secret_across_restarts(tmp_path):
    """Gradio's default BrowserState secret is new at every start: every visitor's saved chats would vanish."""
    import ui
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    from ui.chat_tab import SAVED_CHATS_KEY

    def saved_chats_state():
        settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path)], env={})
        demo = ui.create_demo(Backend(settings))
        states = [b for b in demo.blocks.values() if type(b).__name__ == "BrowserState"]
        return [(s.storage_key, s.secret) for s in states]

    first, second = saved_chats_state(), saved_chats_state()
    assert first == second and [key for key, _ in first] == [SAVED_CHATS_KEY]
    assert len(first[0][1]) >= 16


# ----- start-up order ----------------------------------------------------------------------------
@pytest.mark.slow
def test_the_page_answers_before_warm_up_starts(tmp_path):
    """``app.launch`` serves first and warms up after: Gradio's own start-up check (one ``HEAD /`` with a 3 s
    timeout) must not compete with a warm-up thread that loads the weights."""
    import threading

    from support.app import free_port

    import app
    from neuron_backend.plugins import plug_all
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings

    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-image",
                               "--port", str(free_port())], env={})
    parts = plug_all(app.PLUGINS, settings)  # as app.main: the probes plug-in serves /healthz
    backend = Backend(settings, parts=parts)
    answered = []

    def start():  # what the server says at the moment warm-up would begin (nothing is loaded here)
        try:
            answered.append(httpx.get(f"http://127.0.0.1:{settings.port}/healthz", timeout=5).status_code)
        except httpx.HTTPError as exc:
            answered.append(type(exc).__name__)
        thread = threading.Thread(target=lambda: None)
        thread.start()
        return thread

    backend.runner.start = start
    demo, _ = app.launch(backend, parts, prevent_thread_lock=True, quiet=True)
    try:
        assert answered == [200]
    finally:
        demo.close()


def test_the_start_up_check_waits_out_a_slow_answer(monkeypatch):
    """Gradio's own check gives up at the first 3 s timeout of ``HEAD /`` and the start fails; the app's
    check retries a timeout as Gradio retries a bad status."""
    import httpx
    from gradio import networking

    from ui import GRADIO_URL_OK, patient_url_ok

    answers = iter([httpx.TimeoutException("slow"), httpx.TimeoutException("slow"), 200])

    def head(url, **kwargs):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer)

    monkeypatch.setattr(httpx, "head", head)
    monkeypatch.setattr(networking.time, "sleep", lambda s: None)
    assert patient_url_ok("http://127.0.0.1:9/")
    answers = iter([httpx.TimeoutException("slow"), 200])
    assert GRADIO_URL_OK("http://127.0.0.1:9/") is False  # Gradio's own: the first timeout ends it
