"""The header, the warm-up bar, the task table, the details and the backend's common messages in Arabic
(issue 20): built at run time in the page's language, English unchanged for API clients and logs.

Unit tests build each text under ``i18n.speaking("ar")`` from a real warm backend's status (and variants
of it: warming up, a fallback, counters); the backend's errors are raised through the real code paths.
The browser test opens the page in Arabic and reads the chips, the bar, the table and the details.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
import torch
from app_helpers import free_port
from i18n_check import english_phrases, has_arabic
from test_browser import (  # noqa: F401 - fixtures
    READY_TIMEOUT_MS,
    TABLE_ROWS_JS,
    _open_accordion,
    _shot,
    app_url,
    browser,
    chromium,
)

from neuron_backend.cache import bundle
from neuron_backend.demo_models import DEMO_DIR_NAME
from neuron_backend.engine import ShapeRegistry
from neuron_backend.errors import CacheBundleError, EngineUnavailableError, ShapeFailedError, ShapeNotReadyError
from neuron_backend.memory import NotEnoughMemory, plan_image
from neuron_backend.messages import Message, msg
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import parse_size
from neuron_backend.warmup import Step, Task, TimingHistory, WarmupRunner
from ui import i18n
from ui.header import engine_chips, header_html
from ui.i18n import localized
from ui.status_panel import details_markdown, task_headers, task_table
from ui.status_text import counters_lines, size_choice_label, status_bar_html, task_rows

# Names that stay as they are in either language: products, models, libraries, the demo's labels.
ALLOWED = ("Hugging Face", "AWS Trainium", "FLUX.2-klein", "Qwen3", "TorchNeuron", "torch.compile")


def _arabic(text: str) -> None:
    text = re.sub(r'<span class="i18n-en">[^<]*</span>', "", text)  # both languages' title: CSS hides this one
    assert has_arabic(text), text
    assert english_phrases(text, allowed=ALLOWED) == [], text


def _settings(root: Path, demo_models, *extra):
    (root / DEMO_DIR_NAME).parent.mkdir(parents=True, exist_ok=True)
    if not (root / DEMO_DIR_NAME).exists():
        (root / DEMO_DIR_NAME).symlink_to(demo_models.chat.parent, target_is_directory=True)
    return parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--sizes", "64x64,96x64",
                           "--port", str(free_port()), "--chat-buckets", "32,64", "--context-length", "128",
                           *extra], env={})


@pytest.fixture(scope="module")
def warm(tmp_path_factory, demo_models):
    backend = Backend(_settings(tmp_path_factory.mktemp("i18n-status"), demo_models))
    backend.runner.run()
    return backend


def _warming(status: dict) -> dict:
    """The same snapshot while warming up: a task running at 40 %, one queued with an expectation."""
    status = json.loads(json.dumps(status, default=str)) | {"tasks": [dict(t) for t in status["tasks"]]}
    status.update(warmup_done=False, ready=False, eta_s=5.0, done=3)
    status["tasks"][-2].update(state="running", progress=0.4, expected_s=8.0)
    status["tasks"][-1].update(state="queued", expected_s=75.0, seconds=None, cache_hit=None)
    return status


# ----- the page's texts --------------------------------------------------------------------------------
def test_header_chips_notice_and_bar_in_arabic_english_unchanged(warm):
    status = warm.status()
    assert engine_chips(status) == [("ready", "Chat · demo Qwen3 (tiny) · cpu · ready"),
                                    ("ready", "Image · demo FLUX.2-klein (tiny) · cpu · ready")]
    assert "Warm-up done in" in status_bar_html(status) and "no recompiles" in status_bar_html(status)
    with i18n.speaking("ar"):
        chips = engine_chips(status)
        assert [state for state, _ in chips] == ["ready", "ready"]  # the internal state (colour) stays
        assert chips[0][1] == "المحادثة · Qwen3 تجريبي (مصغّر) · cpu · جاهز"
        page = header_html(status)
        for text in (page, status_bar_html(status), status_bar_html(_warming(status))):
            _arabic(text)
        assert "اكتمل الإحماء في" in status_bar_html(status)
        bar = status_bar_html(_warming(status))
        assert "جارٍ الإحماء:" in bar and "3/" in bar and "يتبقى نحو 5.0 ث" in bar
        alarm = status | {"compiles_since_ready": 2, "fallbacks": {"image": status["fallbacks"].get("image", "")}}
        _arabic(status_bar_html(alarm))
        assert "⚠ 2 ترجمة مخططات بعد الإحماء" in status_bar_html(alarm)


def test_task_table_details_and_counters_in_arabic(warm):
    status = warm.status()
    english = task_rows(status)
    assert english[0][0] == "chat · obtain weights" and english[0][2].startswith("✅ ready")
    assert details_markdown(status).startswith("**Runs on:** CPU")
    with i18n.speaking("ar"):
        assert task_headers() == ["المهمة", "الشكل", "الحالة", "الثواني", "ذاكرة الترجمة", "الخطأ"]
        table = task_table(_warming(status))
        assert table["headers"] == task_headers()
        for row in table["data"]:
            _arabic(" ".join(str(cell) for cell in row[:3] + row[4:]).replace(str(warm.settings.cache_dir), ""))
        assert table["data"][0][0] == "المحادثة · جلب الأوزان"
        assert "(المتوقَّع 1 د 15 ث)" in table["data"][-1][2]
        details = details_markdown(status).replace(str(warm.settings.cache_dir), "")
        _arabic(details)
        assert "**يعمل على:**" in details and "نماذج تجريبية بأوزان عشوائية" in details
        counters = {"compile_counter": status["counters"]["compile_counter"],
                    "memory": {"neuron:0": {"allocated_bytes": 3 * 2**30, "total_bytes": 24 * 2**30}},
                    "cpu_fallback_ops": []}
        lines = "\n".join(counters_lines(counters))
        _arabic(lines)
        assert "3.00 GiB محجوزة من 24.0 GiB" in lines and "لا شيء" in lines
        size = parse_size("64x64")
        for state in ({"state": "queued", "eta_s": 30.0}, {"state": "running", "eta_s": 3.0}, {"state": "ready"},
                      {"state": "failed"}, {"state": "skipped"}):
            label = size_choice_label(size, state)
            assert label.startswith("64x64 (1:1) · ") and has_arabic(label), label
        assert size_choice_label(size, {"state": "running", "eta_s": 3.0}).endswith("قيد الترجمة، ~3.0 ث")
    assert size_choice_label(size, {"state": "running", "eta_s": 3.0}).endswith("· compiling, ~3.0 s")


def test_status_json_stays_english_and_messages_survive_copies(warm):
    status = warm.status()
    assert isinstance(status["banner"], Message) and isinstance(status["tasks"][0]["name"], Message)
    text = json.dumps(status, ensure_ascii=False)  # /status: Message is a str, so it serialises as its English text
    assert "chat · obtain weights" in text and "المحادثة" not in text
    import orjson  # Gradio's own JSON path

    assert "المحادثة" not in orjson.dumps(status).decode()
    copied = pickle.loads(pickle.dumps(status))
    with i18n.speaking("ar"):
        assert localized(copied["tasks"][0]["name"]) == "المحادثة · جلب الأوزان"
        assert localized(copied["banner"]).startswith("CPU")
        _arabic(localized(copied["models_reason"]))


# ----- the backend's messages --------------------------------------------------------------------------
def _failing_runner():
    def fail(task):
        raise EngineUnavailableError(msg("err_engine_loading", engine=msg("backend_engine_chat"), when=""))

    steps = [Step(Task("chat · obtain weights", "chat", "weights"), fail, "k1"),
             Step(Task("chat · load on cpu", "chat", "load"), lambda t: None, "k2")]
    runner = WarmupRunner(steps, TimingHistory(Path("/nonexistent/history.json")))
    runner.run()
    return runner


def _errors(tmp_path, demo_models):
    """(name, exception or message) raised or built by the real code paths."""
    cold = Backend(_settings(tmp_path, demo_models, "--no-image"))
    out = []
    for name in ("image", "chat"):  # disabled; still loading (no warm-up ran)
        try:
            cold.engine(name)
        except EngineUnavailableError as exc:
            out.append((f"engine-{name}", exc))
    registry = ShapeRegistry("image", ["64x64"])
    registry.gated = True
    try:
        registry.require("64x64")
    except ShapeNotReadyError as exc:
        out.append(("shape-warming", exc))
        for task in cold.runner.tasks:
            task.expected_s = 4.0
        out.append(("shape-eta", cold.explain_not_ready("chat", ShapeNotReadyError(exc.args[0], "prefill-32"))))
    registry.mark_failed("64x64", "RuntimeError: out of memory")
    try:
        registry.require("64x64")
    except ShapeFailedError as exc:
        out.append(("shape-failed", exc))
    try:
        bundle.export(tmp_path / "never-started", tmp_path / "out.tar.gz")  # the Export button's packer, no manifest
    except CacheBundleError as exc:
        out.append(("bundle-export", exc))
    memory = plan_image(demo_models.image, torch.float32, "float32", [parse_size("64x64")], "cpu", 2**40)
    out.append(("memory-note", memory.note))
    try:
        plan_image(demo_models.image, torch.float32, "float32", [parse_size("64x64")], "cpu", 1)
    except NotEnoughMemory as exc:
        out.append(("memory-too-big", exc))
    runner = _failing_runner()
    out.append(("task-error", runner.tasks[0].error))
    out.append(("task-skipped", runner.tasks[1].error))
    out.append(("task-names", msg("backend_join_bar", a=cold.runner.tasks[0].name, b=cold.runner.tasks[2].name)))
    out.append(("banner", cold.banner()))
    out.append(("models-reason", cold.settings.models_reason))
    return out


@pytest.mark.parametrize("case", ["engine-image", "engine-chat", "shape-warming", "shape-eta", "shape-failed",
                                  "task-error", "task-skipped", "task-names", "banner", "models-reason",
                                  "bundle-export", "memory-note", "memory-too-big"])
def test_backend_messages_reach_the_page_in_arabic(tmp_path, demo_models, case):
    found = dict(_errors(tmp_path, demo_models))
    value = found[case]
    english = str(value.args[0] if isinstance(value, BaseException) else value)
    assert not has_arabic(english)  # logs, API clients and the CLI read English
    with i18n.speaking("ar"):
        _arabic(localized(value))
    expected = {"engine-image": "The image engine is disabled on this server (--no-image).",
                "engine-chat": "The chat engine is still loading",
                "shape-warming": "image shape 64x64 is still warming up (compiling); try again soon.",
                "shape-eta": "It should be ready in about",
                "task-error": "EngineUnavailableError: The chat engine is still loading; try again shortly.",
                "task-skipped": "chat engine unavailable: weights failed (EngineUnavailableError:",
                "task-names": "chat · obtain weights | chat · prompt bucket 32 tokens + decode graphs",
                "models-reason": "asked for the demo models (--models tiny)"}.get(case)
    assert expected is None or english.startswith(expected) or expected in english, english


# ----- the page in Arabic ------------------------------------------------------------------------------
@pytest.mark.browser
def test_the_status_panel_in_an_arabic_browser(browser, app_url):  # noqa: F811
    context = browser.new_context(locale="ar", viewport={"width": 1280, "height": 1000})
    context.set_default_timeout(30_000)
    page = context.new_page()
    try:
        page.goto(app_url)
        page.locator("#warmup-state", has_text="اكتمل الإحماء").wait_for(timeout=READY_TIMEOUT_MS)
        # the tab title stays a plain string: Gradio 6.31 writes gr.Blocks(title=gr.I18n data) raw ("__i18n__{...}")
        assert page.title() == "Hugging Face on Trainium"
        chips = page.locator("#engine-chips").inner_text()
        assert "المحادثة · Qwen3 تجريبي (مصغّر) · cpu · جاهز" in chips, chips
        header = page.locator("#page-header").inner_text()
        _arabic(header)
        _open_accordion(page, "تفاصيل الإحماء")
        page.locator("#warmup-details-text", has_text="يعمل على").wait_for()
        page.wait_for_function("() => document.querySelector('#warmup-table').innerText.includes('المهمة')")
        headers = page.locator("#warmup-table thead").inner_text()
        assert "المهمة" in headers and "ذاكرة الترجمة" in headers and "task" not in headers, headers
        rows = page.evaluate(TABLE_ROWS_JS)
        assert rows and rows[0][0] == "المحادثة · جلب الأوزان", rows
        assert all("جاهز" in row[2] for row in rows), rows
        _arabic(" ".join(" ".join(row[:3]) for row in rows))
        _arabic(page.locator("#warmup-details-text").inner_text().split("**")[0])
        _shot(page, "i18n-status-ar")
    finally:
        context.close()
