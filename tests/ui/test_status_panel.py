"""The header, the warm-up bar, the task table, the details and the backend's common messages in Arabic:
built at run time in the page's language, English unchanged for API clients and logs.

Unit tests build each text under ``i18n.speaking("ar")`` from a real warm backend's status (and variants
of it: warming up, a fallback, counters); the backend's errors are raised through the real code paths.
The browser test opens the page in Arabic and reads the chips, the bar, the table and the details.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import shutil
import tarfile
from pathlib import Path

import huggingface_hub
import pytest
import torch
from support.app import free_port, link_demo_models, warm_backend
from support.i18n_check import english_phrases, has_arabic
from support.model_folders import truncate

from neuron_backend import weights
from neuron_backend.compile_cache import configure_compile_cache
from neuron_backend.errors import CacheBundleError, EngineUnavailableError, ShapeFailedError, ShapeNotReadyError
from neuron_backend.memory import NotEnoughMemory, plan_image
from neuron_backend.messages import LRI, PDI, Message, tr
from neuron_backend.runtime import Backend, model_folder
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import ImageSize, ShapeRegistry, parse_size
from neuron_backend.warmup import Step, Task, TimingHistory, WarmupRunner
from neuron_backend.weights import verify_folder
from tools.cache import bundle, manifest
from tools.demo_models import plugin as demo_builder
from ui import i18n
from ui.i18n import localized
from ui.presentation import size_choice_label
from ui.status_panel import (
    counters_lines,
    details_markdown,
    engine_chips,
    first_paint_html,
    header_html,
    ltr_runs,
    status_bar_html,
    summary_text,
    task_headers,
    task_rows,
    task_table,
)

# Names that stay as they are in either language: products, models, libraries, the demo's labels.
ALLOWED = ("Hugging Face", "AWS Trainium", "FLUX.2-klein", "Qwen3", "TorchNeuron", "torch.compile")


def _arabic(text: str, allowed: tuple[str, ...] = ()) -> None:
    text = re.sub(r'<span class="i18n-en">[^<]*</span>', "", text)  # both languages' title: CSS hides this one
    assert has_arabic(text), text
    assert english_phrases(text, allowed=ALLOWED + allowed) == [], text


def _settings(root: Path, demo_models, *extra):
    link_demo_models(root, demo_models)
    return parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--sizes", "64x64,96x64",
                           "--port", str(free_port()), "--chat-buckets", "32,64", "--context-length", "128",
                           *extra], env={})


@pytest.fixture(scope="module")
def warm(tmp_path_factory, demo_models):
    settings = _settings(tmp_path_factory.mktemp("i18n-status"), demo_models)
    backend = Backend(settings, parts=demo_builder.plug(settings))
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


def test_the_first_paint_holds_each_language_and_the_bar_keeps_its_lines(warm):
    """Before its first refresh the page shows the header built at start: in both languages (CSS shows the one
    of <html lang>), ids on one copy only; and the bar has the same lines warming up and done, so the page
    under it does not move when warm-up ends."""
    status = warm.status()
    first = first_paint_html(status)
    copies = r'<div class="i18n-en" lang="en">(.*)</div><div class="i18n-ar" lang="ar">(.*)</div>'
    english, arabic = re.fullmatch(copies, first, re.S).groups()
    assert english == header_html(status)
    _arabic(arabic)
    assert ' id="' not in arabic and first.count('id="warmup-state"') == 1
    done, warming = status_bar_html(status), status_bar_html(_warming(status))
    for bar in (done, warming):
        assert bar.count('<div id="warmup-plan"') == 1 and "white-space:nowrap" in bar
    assert "Warmed up: Chat: " in done and "Compile plan: Chat: " in warming
    assert "Image: nothing to compile (eager)" in done  # eager on the CPU: no graph, no eager program
    eager = _warming(status)
    eager["plan"] = {"engines": {name: dict(e, estimate_s=0.0) for name, e in eager["plan"]["engines"].items()}}
    assert "by estimate" not in status_bar_html(eager)  # nothing to compile: no "about 0.0 s by estimate"
    eager["plan"]["engines"][next(iter(eager["plan"]["engines"]))]["estimate_s"] = 90.0
    assert "by estimate" in status_bar_html(eager)  # a graph to compile: its estimate


def test_a_learned_time_under_a_second_reads_almost_done_not_zero_seconds(warm):
    """A restart learns each task's time; the demo's last tasks take milliseconds: "about 0.0 s left" with a
    task still to go read as a stall."""
    nearly = _warming(warm.status()) | {"eta_s": 0.04}
    assert "almost done" in status_bar_html(nearly) and "0.0 s" not in status_bar_html(nearly)
    assert "about 5.0 s left" in status_bar_html(_warming(warm.status()))
    with i18n.speaking("ar"):
        assert "أوشك على الانتهاء" in status_bar_html(nearly)


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
        assert f"{LRI}3.00 GiB{PDI} محجوزة من {LRI}24.0 GiB{PDI}" in lines and "لا شيء" in lines
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
        raise EngineUnavailableError(tr("The {engine} engine is still loading{when}; try again shortly.",
                                        engine=tr("chat"), when=""))

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
    registry = ShapeRegistry("image", [ImageSize(64, 64)])
    registry.gated = True
    try:
        registry.require(ImageSize(64, 64))
    except ShapeNotReadyError as exc:
        out.append(("shape-warming", exc))
        for task in cold.runner.tasks:
            task.expected_s = 4.0
        out.append(("shape-eta", cold.explain_not_ready("chat", ShapeNotReadyError(exc.args[0], "prefill-32"))))
        for task in cold.runner.tasks:
            task.expected_s = 0.0  # past its expected time: nothing left by the estimate
        out.append(("shape-soon", cold.explain_not_ready("chat", ShapeNotReadyError(exc.args[0], "prefill-32"))))
        try:
            cold.engine("chat")
        except EngineUnavailableError as soon:
            out.append(("engine-soon", soon))
    registry.mark_failed(ImageSize(64, 64), "RuntimeError: out of memory")
    try:
        registry.require(ImageSize(64, 64))
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
    out.append(("task-names", tr("{a} | {b}", a=cold.runner.tasks[0].name, b=cold.runner.tasks[2].name)))
    out.append(("banner", cold.banner()))
    out.append(("models-reason", cold.settings.models_reason))
    out.append(("no-demo-builder", _raised(lambda: model_folder(cold.settings, "chat", None))))  # no plug-in builds
    return out


@pytest.mark.parametrize("case", ["engine-image", "engine-chat", "shape-warming", "shape-eta", "shape-failed",
                                  "shape-soon", "engine-soon",
                                  "task-error", "task-skipped", "task-names", "banner", "models-reason",
                                  "bundle-export", "memory-note", "memory-too-big", "no-demo-builder"])
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
                "shape-soon": "image shape 64x64 is still warming up (compiling); try again soon. It should be ready "
                              "any moment now.",
                "engine-soon": "The chat engine is still loading (expected any moment now); try again shortly.",
                "task-error": "EngineUnavailableError: The chat engine is still loading; try again shortly.",
                "task-skipped": "chat engine unavailable: weights failed (EngineUnavailableError:",
                "task-names": "chat · obtain weights | chat · prompt bucket 32 tokens + decode graphs",
                "models-reason": "asked for the demo models (--models tiny)",
                "no-demo-builder": "--models: tiny needs a plug-in that builds the demo models"}.get(case)
    assert expected is None or english.startswith(expected) or expected in english, english


# ----- where the weights come from, the compile cache and its bundles ---------------------------------------
def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the error under test
        return exc
    raise AssertionError("nothing raised")


def _archive(path: Path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> str:
    """A tar.gz with these regular files (and symlinks), as a bundle from elsewhere could be."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return str(path)


def _pin(path: str) -> str:
    """The archive's sha256, as --cache-bundle-sha256 pins it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _manifest(torch_version: str, context: int, engines=("chat", "image")) -> dict:
    shapes = {"chat": ["prefill-32", "prefill-64"], "image": ["64x64"]}
    return {"format": manifest.FORMAT, "software": {"torch": torch_version}, "device": {"machine": "x86_64"},
            "engines": {name: {"model": "demo", "context_length": context, "shapes": shapes[name]}
                        for name in engines}}


def _model_errors(tmp_path, demo_models, monkeypatch):
    """(name, error or message) from weights.py, offline, through their real code paths."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    empty = tmp_path / "empty"
    empty.mkdir()
    lacking = tmp_path / "lacking"
    shutil.copytree(demo_models.chat, lacking)
    (lacking / "tokenizer.json").unlink()
    (lacking / "model.safetensors").unlink()
    damaged = tmp_path / "damaged"
    shutil.copytree(demo_models.chat, damaged)
    truncate(damaged / "model.safetensors")
    (damaged / "tokenizer.json").unlink()
    (damaged / "tokenizer.json").write_text("[1, 2]")  # JSON, not an object
    out = [("no-config", _raised(lambda: weights.check_folder(empty))),
           ("folder-lacks", _raised(lambda: weights.obtain(str(lacking), kind="chat"))),
           ("damaged", _raised(lambda: weights.obtain(str(damaged), kind="chat", flag="--chat-model"))),
           ("offline", _raised(lambda: weights.obtain("Qwen/Qwen3-0.6B", kind="chat"))),
           ("auto-local", weights.weights_available(str(lacking), 1.0, "chat")[1]),
           ("auto-hub", weights.weights_available("Qwen/Qwen3-0.6B", 1.0, "chat")[1])]
    download = weights._Download("Qwen/Qwen3-0.6B", "chat", None, 1.0, 1.0, "--chat-model")
    download.done_bytes, download.total_bytes, download.files = 12 * 10**6, 1_200 * 10**6, ["model.safetensors"]
    seen = []
    download.progress = lambda fraction, text: seen.append(text)
    download._report()
    out += [("progress", seen[0]), ("received", download._amount())]
    missing = verify_folder(lacking, "chat")
    out.append(("missing-file", missing[0]))
    return out


def _cache_errors(tmp_path):
    """(name, error or message) from compile_cache.py and cache/bundle.py, cache/manifest.py."""
    here = _manifest("2.9.0", 128, engines=("chat",))
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache root should be")
    out = [("cache-problem", configure_compile_cache(blocked, environ={}).problem)]
    good = json.dumps(_manifest("2.9.0", 128) | {"files": {}}).encode()
    cases = {"outside": {"manifest.json": good, "../evil.txt": b"x"},
             "no-manifest": {"files/neff/a.neff": b"x"},
             "bad-json": {"manifest.json": b"{not json"},
             "disagree": {"manifest.json": good, "files/neff/a.neff": b"x"}}
    for name, members in cases.items():
        source = _archive(tmp_path / f"{name}.tar.gz", members)
        out.append((f"bundle-{name}", _raised(lambda source=source: bundle.install(source, here, tmp_path / "r",
                                                                                  _pin(source)))))
    link = _archive(tmp_path / "link.tar.gz", {"manifest.json": good}, links=("files/passwd",))
    out.append(("bundle-link", _raised(lambda: bundle.install(link, here, tmp_path / "r", _pin(link)))))
    stale = json.dumps(_manifest("2.8.0", 512) | {"files": {}}).encode()
    other = _archive(tmp_path / "other-host.tar.gz", {"manifest.json": stale})
    out.append(("bundle-nothing", _raised(lambda: bundle.install(other, here, tmp_path / "r", _pin(other)))))
    out.append(("bundle-unpinned", _raised(lambda: bundle.install(other, here, tmp_path / "r", None))))
    out.append(("bundle-pin", _raised(lambda: bundle.install(other, here, tmp_path / "r", "0" * 64))))
    out.append(("bundle-missing", _raised(lambda: bundle.resolve_source(str(tmp_path / "missing.tar.gz")))))
    report = bundle.InstallReport("b.tar.gz", total_graphs=3, installed_files=7, present_files=1)
    report.usable, report.mismatches, report.total_graphs = manifest.compare(
        _manifest("2.9.0", 128), _manifest("2.9.0", 128) | {"engines": {
            "chat": {"model": "demo", "context_length": 128, "shapes": ["prefill-32"]}}})
    out.append(("bundle-summary", report.summary()))
    return out


MODEL_CASES = ["no-config", "folder-lacks", "damaged", "offline", "auto-local", "auto-hub", "progress", "received",
               "missing-file"]
CACHE_CASES = ["cache-problem", "bundle-outside", "bundle-no-manifest", "bundle-bad-json", "bundle-disagree",
               "bundle-link", "bundle-nothing", "bundle-missing", "bundle-summary", "bundle-unpinned", "bundle-pin"]
ENGLISH = {  # what logs, API clients, the CLI and tests/core/test_weights.py, tools/test_cache_bundle.py read
    "no-config": "Model folder ", "folder-lacks": "lacks 2 needed file(s): tokenizer.json, model.safetensors. Copy",
    "damaged": "has damaged or missing files: tokenizer.json: expected a JSON object, found list; model.safetensors: "
               "truncated (",
    "offline": "Qwen/Qwen3-0.6B: 4 needed file(s) are not in the local Hugging Face cache",
    "auto-local": "lacks 2 needed file(s): tokenizer.json, model.safetensors",
    "auto-hub": "Qwen/Qwen3-0.6B is not in the local Hugging Face cache and HF_HUB_OFFLINE is set",
    "progress": "0.01 / 1.20 GB · ", "received": "0.01 GB of 1.20 GB received",
    "missing-file": "tokenizer.json: missing (tokenizer)",
    "cache-problem": "is not writable (", "bundle-outside": "refused: archive member '../evil.txt' is outside files/",
    "bundle-no-manifest": "refused: no manifest.json in the archive", "bundle-bad-json": "is not valid JSON",
    "bundle-disagree": "disagree on 1 files (e.g. neff/a.neff)", "bundle-link": "is not a regular file",
    "bundle-nothing": "nothing installed from other-host.tar.gz: 0 of 3 graphs usable; torch 2.9.0 here, 2.8.0 in "
                      "the bundle; chat context_length: 128 here, 512 in the bundle; image engine: not enabled here",
    "bundle-missing": "does not exist",
    "bundle-unpinned": "a bundle is code (inductor's cache entries are pickles that run when warm-up looks a graph "
                       "up); pass --cache-bundle-sha256 <sha256 of the archive>",
    "bundle-pin": f"not the pinned {'0' * 64} (--cache-bundle-sha256)",
    "bundle-summary": "1 of 3 graphs usable; chat shapes prefill-64: in the bundle, not declared here; "
                      "image engine: not enabled here (1 graphs unused); 7 files installed, 1 already present"}


@pytest.mark.parametrize("case", MODEL_CASES + CACHE_CASES)
def test_model_and_cache_messages_reach_the_page_in_arabic(tmp_path, demo_models, monkeypatch, case):
    found = dict(_model_errors(tmp_path, demo_models, monkeypatch) if case in MODEL_CASES else _cache_errors(tmp_path))
    value = found[case]
    said = value.args[0] if isinstance(value, BaseException) else value
    assert isinstance(said, Message), (case, said)  # translatable, not an f-string
    english = str(said)
    assert ENGLISH[case] in english and not has_arabic(english), english
    with i18n.speaking("ar"):
        arabic = localized(value)
    # What the system says stays as it is: the OS's and json's error text, paths (pytest's tmp folders)
    for system in [str(said.params.get(k, "")) for k in ("problem", "error")] + [str(tmp_path), str(demo_models.chat)]:
        arabic = arabic.replace(system, " ") if system else arabic
    _arabic(arabic)


def test_the_task_table_shows_a_failed_download_in_arabic_flags_in_one_piece(tmp_path, demo_models, monkeypatch):
    errors = dict(_model_errors(tmp_path, demo_models, monkeypatch))
    runner = WarmupRunner([Step(Task("chat · obtain weights", "chat", "weights"),
                                lambda task: (_ for _ in ()).throw(errors["offline"]), "k")],
                          TimingHistory(Path("/nonexistent/history.json")))
    runner.run()
    task = runner.tasks[0]
    status = {"tasks": [{"name": task.name, "shape": None, "state": task.state, "seconds": 0.5, "cache_hit": None,
                         "error": task.error, "progress": None, "detail": None, "kind": "weights", "expected_s": None}]}
    english = task_rows(status)[0]
    assert english[5].startswith("EngineUnavailableError: Qwen/Qwen3-0.6B: 4 needed file(s)") and LRI not in english[5]
    with i18n.speaking("ar"):
        error = task_rows(status)[0][5]
    _arabic(error)
    assert "ليست في الذاكرة المؤقتة المحلية لـ Hugging Face" in error
    assert f"{LRI}--chat-model{PDI}" in error and f"{LRI}`hf download Qwen/Qwen3-0.6B" in error, error


def test_ltr_runs_isolates_technical_runs_on_an_arabic_page_only():
    arabic = "طُلبت النماذج التجريبية (--models tiny) في /data/compile-cache على cpu بحجم 3.00 GiB و64x64 و3/7."
    assert ltr_runs(arabic) == arabic  # outside an Arabic page: unchanged (English pages, API, logs)
    with i18n.speaking("ar"):
        plain = ltr_runs(arabic)
        assert f"({LRI}--models tiny{PDI})" in plain and f"{LRI}/data/compile-cache{PDI}" in plain
        assert f"{LRI}3.00 GiB{PDI}" in plain and " cpu " in plain and "3/7." in plain  # one word, a number: as is
        markup = ltr_runs('<b class="x-y">نص</b> <code>--models full</code> &lt;repo&gt; Qwen3-0.6B.', True)
        assert markup == ('<b class="x-y">نص</b> <code><bdi dir="ltr">--models full</bdi></code> '
                          '<bdi dir="ltr">&lt;repo&gt; Qwen3-0.6B</bdi>.')
        assert ltr_runs("") == ""


# ----- the header and the warm-up table ---------------------------------------------------------------
@pytest.mark.slow
def test_header_has_title_chips_and_the_demo_notice(tmp_path, demo_models):
    backend = warm_backend(tmp_path, demo_models)
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


def test_a_chip_names_the_model_and_a_short_commit(warm):
    status = warm.status()
    status["demo"] = False
    status["models"] = {"chat": "Qwen/Qwen3-0.6B@0123456789abcdef0123456789abcdef01234567",
                        "image": "org/klein@refs/pr/1"}
    assert [text for _, text in engine_chips(status)] == ["Chat · Qwen3-0.6B@0123456 · cpu · ready",
                                                          "Image · klein@refs/pr/1 · cpu · ready"]
    status["models"] = {"chat": "/data/models@v1/qwen", "image": "black-forest-labs/FLUX.2-klein-4B"}
    assert [text for _, text in engine_chips(status)] == ["Chat · qwen · cpu · ready",
                                                          "Image · FLUX.2-klein-4B · cpu · ready"]


def test_the_summary_names_the_engines_and_models_this_page_runs(warm):
    """The sentence under the title names what the page runs: the two specified models for the demo's stand-ins,
    else each engine's own checkpoint, and only the engines that are enabled."""
    status = warm.status()
    assert summary_text(status).startswith("Chat with Qwen3-0.6B and draw with FLUX.2-klein-4B, run natively")
    status["demo"] = False
    status["models"] = {"image": "black-forest-labs/FLUX.2-klein-base-4B"}
    status["engines"]["chat"] = {"state": "disabled"}
    assert summary_text(status).startswith("Draw with FLUX.2-klein-base-4B, run natively on Trainium")
    assert "Qwen3" not in header_html(status) and "Draw with FLUX.2-klein-base-4B" in header_html(status)
    with i18n.speaking("ar"):
        page = header_html(status)
        assert '<bdi dir="ltr">FLUX.2-klein-base-4B</bdi>' in page and "ارسم بـ" in page
        _arabic(page)
    status["models"] = {"chat": "<my-qwen>", "image": "org/klein"}  # a local folder, as a visitor's status has it
    status["engines"] |= {"chat": {"state": "ready"}, "image": {"state": "disabled"}}
    assert summary_text(status).startswith("Chat with my-qwen, run natively on Trainium")


def test_queued_tasks_show_expectations_in_the_state_not_the_seconds_column():
    task = {"name": "image · size 64x64", "shape": "64x64", "state": "queued", "seconds": None, "cache_hit": None,
            "error": None, "expected_s": 12.0, "progress": None, "detail": None}
    row = task_rows({"tasks": [task]})[0]
    assert row[3] == "" and "expected 12 s" in row[2]

    from neuron_backend.shapes import parse_size

    size = parse_size("64x64")  # only the running task compiles: the others say they wait
    assert size_choice_label(size, {"state": "queued", "eta_s": 30.0}).endswith("· queued, ~30 s")
    assert size_choice_label(size, {"state": "running", "eta_s": 3.0}).endswith("· compiling, ~3.0 s")
