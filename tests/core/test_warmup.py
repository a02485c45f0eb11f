"""Warm-up orchestration and status snapshot on the tiny models (CPU)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_backend.errors import EngineUnavailableError, ShapeFailedError, ShapeNotReadyError
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import ImageSize
from neuron_backend.warmup import HIT_SUFFIX, READY, Step, Task, TimingHistory, WarmupRunner
from tools.demo_models import plugin as demo_builder

ROOT = Path(__file__).resolve().parents[2]


def make_backend(tmp_path, *extra):
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path),
                               "--sizes", "64x64,96x64", "--chat-buckets", "32,64,128", "--context-length", "256",
                               "--references", "0", *extra], env={})  # text-to-image only: test_image_edit plans slots
    return Backend(settings, parts=demo_builder.plug(settings))


def test_plan_order_and_initial_state(tmp_path):
    backend = make_backend(tmp_path)
    tasks = backend.runner.tasks
    kinds = [(t.engine, t.kind, t.shape) for t in tasks]
    # weights, load and first shape of each engine first, then the remaining shapes
    assert kinds[:6] == [("chat", "weights", None), ("chat", "load", None), ("chat", "compile", "prefill-32"),
                         ("image", "weights", None), ("image", "load", None), ("image", "compile", "64x64")]
    assert kinds[6:] == [("chat", "compile", "prefill-64"), ("chat", "compile", "prefill-128"),
                         ("image", "compile", "96x64")]
    snap = backend.status()
    json.dumps(snap)
    assert {t["state"] for t in snap["tasks"]} == {"queued"} and not snap["ready"] and snap["done"] == 0
    assert snap["eta_s"] is None  # nothing learned yet
    with pytest.raises(EngineUnavailableError, match="still loading"):
        backend.engine("chat")


def test_order_is_configurable(tmp_path):
    backend = make_backend(tmp_path, "--warmup-order", "image,chat")
    assert backend.runner.tasks[0].engine == "image"


@pytest.mark.slow
def test_state_transitions_history_and_eta(tmp_path):
    backend = make_backend(tmp_path)
    seen = []
    for step in backend.runner._steps:  # record the running task's state as each step runs
        original = step.run

        def spy(task, original=original):
            seen.append((task.name, task.state, backend.status()["done"]))
            return original(task)

        step.run = spy
    backend.runner.run()
    assert all(state == "running" for _, state, _ in seen)
    assert [done for *_, done in seen] == list(range(len(seen)))
    snap = backend.status()
    assert snap["ready"] and snap["done"] == snap["total"] and snap["progress"] == 1.0 and snap["eta_s"] == 0.0
    assert all(t["state"] == "ready" and t["seconds"] is not None for t in snap["tasks"])
    assert snap["compiles_since_ready"] == 0 and snap["engines"]["chat"]["state"] == "ready"
    history = json.loads((tmp_path / "warmup-history.json").read_text())
    assert len(history) == snap["total"]

    # A second start with the same cache root knows how long each task takes: an ETA up front.
    again = make_backend(tmp_path)
    assert all(t.expected_s is not None for t in again.runner.tasks)
    eta = again.status()["eta_s"]
    assert eta == pytest.approx(sum(history.values()), abs=0.2)
    assert again.runner.eta_until("image", "96x64") == pytest.approx(eta, abs=0.2)


@pytest.mark.slow
def test_failing_shape_is_isolated(tmp_path, monkeypatch):
    from neuron_backend.image.engine import ImageEngine, ImageRequest

    original = ImageEngine.warm_up

    def flaky(self, shape):
        if shape == ImageSize(96, 64):
            self.shapes.mark_failed(shape, "simulated compiler crash")
            raise RuntimeError("simulated compiler crash")
        return original(self, shape)

    monkeypatch.setattr(ImageEngine, "warm_up", flaky)
    backend = make_backend(tmp_path)
    backend.runner.run()
    snap = backend.status()
    states = {t["shape"]: t["state"] for t in snap["tasks"] if t["kind"] == "compile"}
    assert states == {"prefill-32": "ready", "prefill-64": "ready", "prefill-128": "ready",
                      "64x64": "ready", "96x64": "failed"}
    assert "simulated compiler crash" in next(t["error"] for t in snap["tasks"] if t["shape"] == "96x64")
    # One readiness answer: a failed shape is not ready in /status (and MCP's warmup_status, which reads it)
    # nor in /readyz, although warm-up is over and both engines serve.
    assert snap["warmup_done"] is True and snap["engines"]["image"]["state"] == "ready"
    assert snap["ready"] is False and backend.readiness()[0] is False
    assert [name for name in backend.readiness()[1]["failed"]] == [
        next(t["name"] for t in snap["tasks"] if t["shape"] == "96x64")]
    with pytest.raises(ShapeFailedError, match="simulated compiler crash"):
        backend.generate_image(ImageRequest(prompt="a cat", size="96x64", steps=1, seed=1))
    assert backend.generate_image(ImageRequest(prompt="a cat", size="64x64", steps=1, seed=1)).image.size == (64, 64)


@pytest.mark.slow
def test_failed_engine_load_leaves_the_other_serving(tmp_path, monkeypatch):
    from neuron_backend.chat.engine import ChatEngine, ChatRequest
    from neuron_backend.image.engine import ImageRequest

    def broken(self, folder):
        raise OSError("model.safetensors is truncated")

    monkeypatch.setattr(ChatEngine, "load", broken)
    backend = make_backend(tmp_path)
    backend.runner.run()
    snap = backend.status()
    chat_tasks = [t for t in snap["tasks"] if t["engine"] == "chat"]
    assert [t["state"] for t in chat_tasks] == ["ready", "failed", "skipped", "skipped", "skipped"]
    assert snap["engines"]["chat"]["state"] == "failed" and "truncated" in snap["engines"]["chat"]["reason"]
    with pytest.raises(EngineUnavailableError, match="truncated"):
        list(backend.stream_chat(ChatRequest(message="hi")))
    assert backend.generate_image(ImageRequest(prompt="ok", size="64x64", steps=1, seed=3)).seed == 3


@pytest.mark.slow
def test_not_ready_shape_refused_with_eta(tmp_path):
    from neuron_backend.image.engine import ImageRequest

    backend = make_backend(tmp_path)
    steps = backend.runner._steps
    # Run everything but the last image size: that one stays queued (gated).
    for step in steps[:-1]:
        backend.runner._run_step(step)
    steps[-1].task.expected_s = 12.0
    with pytest.raises(ShapeNotReadyError, match=r"96x64 is still warming up.*about 12 s"):
        backend.generate_image(ImageRequest(prompt="a cat", size="96x64", steps=1, seed=1))
    states = backend.shape_states("image")
    assert states["64x64"]["state"] == "ready" and states["96x64"]["state"] == "queued"


def test_disabled_engine(tmp_path):
    backend = make_backend(tmp_path, "--no-chat")
    assert {t.engine for t in backend.runner.tasks} == {"image"}
    with pytest.raises(EngineUnavailableError, match="disabled"):
        backend.engine("chat")
    assert backend.status()["engines"]["chat"]["state"] == "disabled"


WARM_START = textwrap.dedent("""
    import json, sys, time, torch
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    from tools.demo_models import plugin as demo_builder
    s = parse_settings(["--models", "tiny", "--device", "cpu", "--compile", "on", "--no-image",
                        "--chat-buckets", "16", "--context-length", "48", "--cache-dir", sys.argv[1]], env={})
    backend = Backend(s, parts=demo_builder.plug(s))
    backend.runner.run()
    snap = backend.status()
    print(json.dumps({"tasks": snap["tasks"], "cache_hits": snap["cache_hits"],
                      "total_s": time.perf_counter() - t0}))
""")


@pytest.mark.slow
def test_second_start_hits_the_compile_cache(tmp_path):
    def start():
        out = subprocess.run([sys.executable, "-c", WARM_START, str(tmp_path)], capture_output=True, text=True,
                             timeout=600, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold, warm = start(), start()
    compile_task = lambda run: next(t for t in run["tasks"] if t["kind"] == "compile")  # noqa: E731
    assert compile_task(cold)["state"] == compile_task(warm)["state"] == "ready"
    assert compile_task(cold)["cache_hit"] is False and compile_task(warm)["cache_hit"] is True
    assert warm["cache_hits"] == 1 and cold["cache_hits"] == 0
    assert compile_task(warm)["seconds"] < compile_task(cold)["seconds"]
    assert (tmp_path / "compile-cache" / "inductor").is_dir()


@pytest.mark.slow
def test_compiles_since_ready_alarm(tmp_path):
    from neuron_backend.chat.text import ChatRequest

    backend = make_backend(tmp_path, "--compile", "on", "--no-image", "--chat-buckets", "32,64",
                           "--context-length", "96")
    backend.runner.run()
    assert backend.status()["compiles_since_ready"] == 0
    buckets = set()
    for words in (1, 3, 6, 12, 30):  # the demo template takes ~25 tokens: prompts land in both buckets
        final = list(backend.stream_chat(ChatRequest(message="demo " * words, max_new_tokens=3, greedy=True)))[-1]
        assert final.stats.compiled_graphs == 0
        buckets.add(final.stats.bucket)
    assert buckets == {32, 64}
    assert backend.status()["compiles_since_ready"] == 0
    torch.compile(lambda x: x * 2 + 1, backend="inductor")(torch.ones(3))  # an out-of-plan compile
    assert backend.status()["compiles_since_ready"] == 1


def _runner(history: TimingHistory, names: list[str]) -> WarmupRunner:
    steps = [Step(Task(name, "image", "compile", name), lambda task: None, name) for name in names]
    return WarmupRunner(steps, history)


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
