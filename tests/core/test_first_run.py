"""The first warm-up on a host: its compile plan and first-run ETA, and the per-task compile time limit."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import psutil
import pytest
from support.fake_neuronx_cc import write as fake_compiler

from neuron_backend.chat import static_cache
from neuron_backend.errors import ConfigError, ShapeFailedError
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import PromptBucket
from neuron_backend.warmup import FAILED, READY, Step, Task, TimingHistory, WarmupRunner
from tools.demo_models import plugin as demo_builder
from ui.status_panel import status_bar_html, task_rows


def make_backend(tmp_path, *extra):
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path),
                               "--sizes", "64x64,96x64", "--chat-buckets", "32,64,128", "--context-length", "256",
                               "--references", "0", *extra], env={})
    return Backend(settings, parts=demo_builder.plug(settings))


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# ----- the plan ------------------------------------------------------------------------------------------
def test_the_plan_is_shown_before_anything_compiles(tmp_path):
    backend = make_backend(tmp_path, "--compile", "on")
    settings, chat = backend.settings, backend.placements["chat"]
    windows = static_cache.declared(settings.cache_windows, settings.context_length)
    chunk = static_cache.chunk_size(settings, chat.compile)
    status = backend.status()
    plan = status["plan"]
    # chat: every decode window and every prefill-chunk window once (what dynamo's recompile limit is set to)
    assert plan["engines"]["chat"]["graphs"] == static_cache.recompile_limit(windows, settings.buckets, chunk)
    assert plan["engines"]["image"]["graphs"] == len(settings.sizes)  # one whole transformer graph per size
    assert plan["graphs"] == plan["engines"]["chat"]["graphs"] + len(settings.sizes)
    assert status["eta_s"] is None and plan["eta_s"] > 0 and not plan["learned"]  # nothing learned: the estimate
    compile_tasks = [t for t in status["tasks"] if t["kind"] == "compile"]
    assert sum(t["graphs"] for t in compile_tasks) == plan["graphs"] and all(t["estimate_s"] is not None
                                                                              for t in compile_tasks)
    bar = status_bar_html(status)
    assert "Compile plan:" in bar and "Chat: " in bar and "by the first-run estimate" in bar
    assert "first-run estimate" in task_rows(status)[2][2]  # the first chat bucket's row


def test_an_eager_first_start_does_not_promise_zero_seconds(tmp_path):
    """Nothing compiles (eager) and nothing is learned yet: the loads have no estimate, so the bar says the ETA
    comes later, not "about 0.0 s left" while tasks are still to go."""
    backend = make_backend(tmp_path, "--compile", "off")
    status = backend.status()
    assert status["eta_s"] is None and status["plan"]["eta_s"] == 0.0 and status["done"] < status["total"]
    bar = status_bar_html(status)
    assert "ETA learned after the first start" in bar and "0.0 s left" not in bar


def test_learned_times_replace_the_estimate(tmp_path):
    history = TimingHistory(tmp_path / "history.json")
    history.record("b", 2.0)

    def task(name):
        return Task(name, "chat", "compile", name, graphs=1, eager_programs=0, estimate_s=100.0)

    runner = WarmupRunner([Step(task("a"), lambda t: None, "a"), Step(task("b"), lambda t: None, "b")], history)
    plan = runner.snapshot()["plan"]
    assert plan["eta_s"] == 102.0 and not plan["learned"]  # "a" by its estimate, "b" as learned
    history.record("a", 3.0)
    runner = WarmupRunner([Step(task("a"), lambda t: None, "a"), Step(task("b"), lambda t: None, "b")], history)
    snap = runner.snapshot()
    assert snap["plan"]["eta_s"] == snap["eta_s"] == 5.0 and snap["plan"]["learned"]


# ----- the compile time limit ----------------------------------------------------------------------------
def test_compile_timeout_setting(tmp_path):
    assert parse_settings(["--models", "tiny"], env={}).compile_timeout_min == 60.0
    env = {"SHOWCASE_COMPILE_TIMEOUT_MIN": "1.5"}
    assert parse_settings(["--models", "tiny"], env=env).compile_timeout_min == 1.5
    assert make_backend(tmp_path, "--compile-timeout-min", "1.5").runner.compile_timeout_s == 90.0
    assert make_backend(tmp_path, "--compile-timeout-min", "0").runner.compile_timeout_s is None
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(ConfigError, match="--compile-timeout-min"):
            parse_settings(["--models", "tiny", "--compile-timeout-min", bad], env={})


@pytest.mark.slow
def test_a_slow_compile_reads_still_compiling_then_fails_at_the_limit(tmp_path):
    release, told = threading.Event(), []
    slow = Task("chat · slow bucket", "chat", "compile", "prefill-64", graphs=1, eager_programs=0, estimate_s=0.1)
    after = Task("chat · next bucket", "chat", "compile", "prefill-128", graphs=1, eager_programs=0, estimate_s=0.1)
    steps = [Step(slow, lambda task: release.wait(30), "slow", lambda task, message: told.append(message)),
             Step(after, lambda task: None, "after")]
    runner = WarmupRunner(steps, TimingHistory(tmp_path / "history.json"), compile_timeout_s=1.0)
    runner.start()
    try:
        wait_for(lambda: runner.snapshot()["tasks"][0]["still_compiling"])  # past half the limit
        status = runner.snapshot()
        assert status["tasks"][0]["state"] == "running"
        bar = status_bar_html(status)
        assert "still compiling after" in bar and "(limit 1.0 s per graph)" in bar
        assert "still compiling after" in task_rows(status)[0][2]
        assert runner.wait(30)  # the warm-up goes on past the limit, the slow compile still blocked
        assert slow.state == FAILED and after.state == READY
        assert "--compile-timeout-min" in slow.error and "refused until a restart" in slow.error
        assert told == [slow.error]
    finally:
        release.set()


def compiles(seconds: list[float], started: list):
    """A compile step that runs one ``neuronx-cc`` (found on PATH, as TorchNeuron runs it) per graph, in turn."""

    def step(task):
        for _ in seconds:
            proc = subprocess.Popen(["neuronx-cc", "--target", "trn2"])
            started.append(proc)
            if proc.wait() != 0:
                raise RuntimeError(f"neuronx-cc exited {proc.returncode}")

    return step


@pytest.mark.slow
def test_a_task_of_several_graphs_may_outlive_one_graphs_limit(tmp_path, monkeypatch):
    seen = tmp_path / "seen"  # a run computes 1 s, and on until the warm-up's watch has looked at it
    compiler = fake_compiler(tmp_path / "bin", busy_s=1.0, until=seen)  # past its estimate, within the limit
    monkeypatch.setenv("PATH", f"{compiler.parent}{os.pathsep}{os.environ['PATH']}")
    started = []
    task = Task("chat · bucket 32", "chat", "compile", "prefill-32", graphs=3, eager_programs=0, estimate_s=0.3)

    def step(task):
        for number in (1, 2, 3):
            proc = subprocess.Popen(["neuronx-cc", "--target", "trn2"])
            started.append(proc)
            wait_for(lambda n=number: (task.compiling or {}).get("run") == n)
            seen.touch()
            assert proc.wait() == 0
            seen.unlink()

    runner = WarmupRunner([Step(task, step, "k")], TimingHistory(tmp_path / "h.json"), compile_timeout_s=2.0)
    runner.run()
    assert task.state == READY, task.error  # 3 graphs in 3 s or more: past one graph's limit, never past its own
    assert len(started) == 3 and all(p.returncode == 0 for p in started)
    assert [r["run"] for r in task.compiler_runs] == [1, 2, 3]  # each one counted, in its task's order


@pytest.mark.slow
def test_a_graph_that_makes_progress_is_never_killed_and_the_panel_says_which_and_how_long(tmp_path, monkeypatch):
    # one graph computing for 6 s, past the 2 s limit (a starved run must still add CPU time within 2 s)
    compiler = fake_compiler(tmp_path / "bin", busy_s=6.0)
    monkeypatch.setenv("PATH", f"{compiler.parent}{os.pathsep}{os.environ['PATH']}")
    started = []
    task = Task("chat · bucket 32", "chat", "compile", "prefill-32", graphs=1, eager_programs=0, estimate_s=0.1)
    runner = WarmupRunner([Step(task, compiles([6.0], started), "k")], TimingHistory(tmp_path / "h.json"),
                          compile_timeout_s=2.0)
    runner.start()
    wait_for(lambda: (runner.snapshot()["tasks"][0]["compiling"] or {}).get("seconds", 0) >= 3.0, 30)
    status = runner.snapshot()
    assert status["tasks"][0]["compiling"]["run"] == 1 and status["tasks"][0]["state"] == "running"
    assert "neuronx-cc run 1 compiling for" in task_rows(status)[0][2]
    assert "neuronx-cc run 1 compiling for" in status_bar_html(status)
    assert runner.wait(60)
    assert task.state == READY, task.error
    assert started[0].returncode == 0 and task.compiling is None
    [run] = task.compiler_runs  # what the device check records per graph: its wall and CPU seconds
    assert run["run"] == 1 and run["ended"] and 5.0 <= run["seconds"] <= 20.0 and run["cpu_s"] >= 0.5, run


@pytest.mark.slow
def test_a_shape_past_the_limit_is_refused_with_what_to_do(tmp_path, monkeypatch):
    from neuron_backend.chat.engine import ChatEngine

    release, original = threading.Event(), ChatEngine.warm_up

    def blocked_at_64(self, shape):
        if shape.tokens == 64:
            release.wait(60)
        return original(self, shape)

    monkeypatch.setattr(ChatEngine, "warm_up", blocked_at_64)
    backend = make_backend(tmp_path, "--no-image", "--compile-timeout-min", "0.1")  # 6 s
    try:
        backend.runner.run()
        states = {t.shape: t.state for t in backend.runner.tasks if t.kind == "compile"}
        assert states == {"prefill-32": READY, "prefill-64": FAILED, "prefill-128": READY}
        shapes = backend.engine("chat").shapes
        with pytest.raises(ShapeFailedError, match="compile-timeout-min"):
            shapes.require(PromptBucket(64))
        assert not backend.status()["ready"]
    finally:
        release.set()
    # the abandoned compile ends later: what it built is not used, the shape stays refused
    for thread in [t for t in threading.enumerate() if t.name == "warmup-chat"]:
        thread.join(60)
    with pytest.raises(ShapeFailedError, match="compile-timeout-min"):
        shapes.require(PromptBucket(64))


@pytest.mark.slow
def test_a_stuck_neuronx_cc_is_killed_at_the_compile_limit_and_nothing_else(tmp_path, monkeypatch):
    compiler = fake_compiler(tmp_path / "bin", hang_s=600)
    monkeypatch.setenv("PATH", f"{compiler.parent}{os.pathsep}{os.environ['PATH']}")
    bystander = subprocess.Popen(["sleep", "60"])  # another child of this process: not a compiler
    started = []

    def compile_step(task):
        proc = subprocess.Popen(["neuronx-cc", "--target", "trn2"])  # found on PATH, as TorchNeuron runs it
        started.append(proc)
        proc.wait()
        raise RuntimeError(f"neuronx-cc exited {proc.returncode}")

    runner = WarmupRunner([Step(Task("chat · bucket 32", "chat", "compile", "prefill-32"), compile_step, "k")],
                          TimingHistory(tmp_path / "history.json"), compile_timeout_s=1.0)
    try:
        began = time.monotonic()
        runner.start()
        wait_for(lambda: started and psutil.Process(started[0].pid).children(), 10)
        helpers = psutil.Process(started[0].pid).children()  # the compiler's own child (its sleep)
        assert runner.wait(30)
        assert time.monotonic() - began < 20
        task = runner.tasks[0]
        assert task.state == FAILED and "still compiling" in task.error
        started[0].wait(timeout=10)  # ended within seconds, not 600 s (the kill reaps it: no return code to read)
        assert not psutil.pid_exists(started[0].pid)
        psutil.wait_procs(helpers, timeout=10)
        assert not any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in helpers)
        assert bystander.poll() is None  # a child that is no compiler is left alone
    finally:
        bystander.kill()
        for proc in started:
            for left in [*psutil.Process(proc.pid).children(recursive=True), proc] if proc.poll() is None else []:
                left.kill()
