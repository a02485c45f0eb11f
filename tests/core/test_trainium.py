"""First run on a Trainium2 host, with torch.neuron faked by tests/support/fake_neuron.py.

The fake models TorchNeuron's thread-local current device and a compiled call that raises
"Inconsistent device IDs" when the calling thread's device is not the core its weights sit on; the
real tiny models run on CPU tensors with placements that say neuron:0 / neuron:1.
"""

from __future__ import annotations

import threading

import pytest
import torch
from starlette.applications import Starlette
from starlette.testclient import TestClient
from support import fake_neuron

from neuron_backend import devices
from neuron_backend.compile_cache import CompileCounter
from neuron_backend.errors import ShapeFailedError
from neuron_backend.image.engine import ImageRequest
from neuron_backend.plugins import plug_all
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import ImageSize
from tools.aot import plugin as saved_forwards
from tools.chat_batch import plugin as chat_batch
from tools.demo_models import plugin as demo_builder
from tools.probes.routes import probe_routes
from ui.presentation import visitor_status
from ui.status_panel import counters_lines, task_rows


@pytest.fixture
def neuron(monkeypatch):
    """Two fake NeuronCores; placements keep their cores but hold CPU tensors; counters restored after.

    Dynamo's caches are emptied before and after: a graph compiled in another test would run through
    that test's fake, out of this one's sight (no compile submitted here, no compiled call counted)."""
    torch._dynamo.reset()
    fake = fake_neuron.install(monkeypatch, cores=2)
    monkeypatch.setattr(CompileCounter, "mode", "auto")  # neuron counters while torch.neuron exists
    fake_neuron.cpu_backed_placements(monkeypatch)
    fake_neuron.place_on_load(monkeypatch, fake)
    yield fake
    torch._dynamo.reset()


def neuron_backend(root, *extra) -> Backend:
    """On the fake cores, with the demo models' builder, the saved-forwards (auto: off on Neuron) and chat batch
    plug-ins as the app has them."""
    plugins = (demo_builder, saved_forwards, chat_batch)
    settings = parse_settings(["--models", "tiny", "--cache-dir", str(root), "--sizes", "64x64",
                               "--chat-buckets", "32", "--max-new-tokens", "4", *extra], env={}, plugins=plugins)
    return Backend(settings, devices.HostDevices(neuron_cores=2, cuda_devices=0), plug_all(plugins, settings))


def in_thread(fn):
    """Run ``fn`` on a fresh thread (one that never chose a device) and return its result or raise its error."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(300)
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_the_fake_models_a_thread_local_device_and_the_compiled_call_check(neuron):
    neuron.place([torch.ones(2)], 1)  # the first device a thread selected becomes the process default
    assert neuron.current_device() == 0 and in_thread(neuron.current_device) == 1
    with neuron.device(0):
        assert neuron.current_device() == 0 and in_thread(neuron.current_device) == 1
    weights = torch.ones(3)
    neuron.place([weights], 0)
    fn = torch.compile(lambda w: w * 2, backend="neuron", fullgraph=True)
    with neuron.device(1), pytest.raises(Exception, match="Inconsistent device IDs"):
        fn(weights)
    with neuron.device(0):
        assert fn(weights).tolist() == [2.0, 2.0, 2.0]


def test_on_device_selects_the_placement_core_per_thread(neuron):
    settings = parse_settings(["--models", "tiny"], env={})
    placements = devices.resolve_placements(settings, devices.HostDevices(2, 0))
    image = placements["image"]
    assert (placements["chat"].core, image.core) == (0, 1)
    neuron.set_device(0)  # this thread's own choice; the process default is now 0
    assert in_thread(devices.bound(image, neuron.current_device)) == 1
    with devices.on_device(image):
        assert neuron.current_device() == 1
    assert neuron.current_device() == 0
    with devices.on_device(devices.resolve_placements(
            parse_settings(["--models", "tiny", "--device", "cpu"], env={}))["chat"]):
        assert neuron.current_device() == 0  # cpu: nothing to select


def test_synchronize_waits_for_the_placement_core_not_the_current_one(neuron):
    image = devices.resolve_placements(parse_settings(["--models", "tiny"], env={}), devices.HostDevices(2, 0))["image"]
    in_thread(lambda: devices.synchronize(image))  # a thread whose current device is 0
    assert neuron.synchronized == [1]


@pytest.mark.slow
@pytest.mark.parametrize("batch", ["1", "2"])
def test_chat_on_core_0_and_image_on_core_1_warm_up_and_serve_compiled(neuron, tmp_path, batch):
    # image first: its load selects core 1 first, which makes 1 the default of threads that never chose
    backend = neuron_backend(tmp_path, "--warmup-order", "image,chat", "--chat-batch", batch)
    assert backend.placements["chat"].compile and backend.placements["image"].compile  # compile auto -> on
    backend.runner.run()
    assert [t.state for t in backend.runner.tasks] == ["ready"] * len(backend.runner.tasks), \
        [(t.name, t.error) for t in backend.runner.tasks]
    reply = in_thread(lambda: list(backend.stream_chat({"message": "hi", "history": [], "greedy": True})))
    assert reply[-1].done and reply[-1].stats.new_tokens >= 1
    call = backend.start_image(ImageRequest("a fox", "64x64", steps=1, seed=3))  # its own image-call thread
    assert call.wait(300)
    assert call.result().image.size == (64, 64)
    cores = {core for core, _ in neuron.compiled_calls}
    assert cores == {0, 1} and all(core == current for core, current in neuron.compiled_calls)


@pytest.mark.slow
def test_a_failed_compile_on_neuron_falls_back_to_eager_and_serves(neuron, tmp_path):
    neuron.compile_error = "neuronx-cc: internal compiler error (exit 70)"
    backend = neuron_backend(tmp_path)
    backend.runner.run()
    compile_tasks = [t for t in backend.runner.tasks if t.kind == "compile"]
    assert [t.state for t in backend.runner.tasks] == ["ready"] * len(backend.runner.tasks), \
        [(t.name, t.error) for t in backend.runner.tasks]
    for task in compile_tasks:
        assert task.detail.startswith("eager fallback: ") and "internal compiler error" in task.detail
    rows = task_rows(backend.status())
    assert sum("eager fallback" in row[2] for row in rows) == len(compile_tasks)
    probe = TestClient(Starlette(routes=probe_routes(backend)))  # a shape that serves eager is ready in /readyz
    assert [probe.get(f"/readyz?shape={s}").status_code for s in ("prefill-32", "64x64", "64x64+1ref")] == \
        [200, 200, 200]  # the edit slot's "+" as a URL written by hand has it (a query string reads a space)
    served = {"state": "ready", "eta_s": 0.0}
    assert probe.get("/readyz").json()["shapes"] == {"chat": {"prefill-32": served},
                                                     "image": {"64x64": served, "64x64+1ref": served}}
    reply = in_thread(lambda: list(backend.stream_chat({"message": "hi", "history": [], "greedy": True})))
    assert reply[-1].done and reply[-1].stats.new_tokens >= 1
    image = in_thread(lambda: backend.generate_image(ImageRequest("a fox", "64x64", steps=1, seed=3)))
    assert image.image.size == (64, 64)
    assert not neuron.compiled_calls  # nothing ran compiled


@pytest.mark.slow
def test_a_refused_save_is_no_compile_failure_and_the_status_says_it_once(neuron, tmp_path):
    neuron.saveable = "unpicklable"  # aot_compile takes the neuron result; saving it raises a pickling error
    backend = chat_backend(tmp_path, "--chat-aot", "on")
    backend.runner.run()
    compile_tasks = [t for t in backend.runner.tasks if t.kind == "compile"]
    assert [t.state for t in compile_tasks] == ["ready", "ready"], [(t.name, t.error) for t in compile_tasks]
    forward = backend.engine("chat").saved_forwards
    assert forward.refused_saves >= 2 and neuron.save_attempts == forward.refused_saves and forward.saved == 0
    details = [t.detail or "" for t in compile_tasks]
    assert not any("eager fallback" in d for d in details), details  # every graph still runs compiled
    assert "not saved for the next start" in details[0] and "cannot pickle" in details[0]
    assert "not saved" not in details[1]  # shown once
    attempts = neuron.save_attempts
    replies(backend)
    assert neuron.save_attempts == attempts  # no save retried when serving


@pytest.mark.slow
def test_an_out_of_memory_fails_its_shape_with_what_to_do_and_is_not_run_eager(neuron, tmp_path):
    neuron.run_error = RuntimeError("nrt_tensor_allocate: out of memory on NeuronCore 1 (HBM)")
    backend = neuron_backend(tmp_path, "--no-chat", "--references", "0")
    backend.runner.run()
    task = next(t for t in backend.runner.tasks if t.kind == "compile")
    assert task.state == "failed" and "DeviceMemoryError" in task.error, (task.state, task.error, task.detail)
    assert "not retried eager" in task.error and "--sizes" in task.error
    assert not backend.engine("image").shapes.eager  # no eager fallback hides it
    with pytest.raises(ShapeFailedError, match="out of memory"):
        backend.engine("image").shapes.require(ImageSize(64, 64))


CHUNK_FAILS = "neuronx-cc: prefill chunk graph failed (exit 70)"
# A first turn of each bucket (32 and 64 tokens with the demo tokenizer's template)
PROMPTS = ["hi", "Tell me about the weather on the coast today."]


def chat_backend(root, *extra) -> Backend:
    """Chat only, buckets 32 and 64 over a 256-token cache: one prefill chunk graph (32 tokens) shared by both."""
    return neuron_backend(root, "--no-image", "--chat-buckets", "32,64", "--context-length", "256",
                          "--max-new-tokens", "6", *extra)


def replies(backend) -> list:
    return [in_thread(lambda m=m: list(backend.stream_chat({"message": m, "history": [], "greedy": True}))[-1])
            for m in PROMPTS]


@pytest.mark.slow
@pytest.mark.parametrize("surfaces_at", ["execution", "synchronize"])
def test_a_failing_prefill_chunk_graph_keeps_decode_compiled_and_the_same_tokens(neuron, tmp_path, surfaces_at):
    # Neuron: the compile error comes at the graph's first run or the next synchronize, for query length > 1 only
    neuron.deferred_error, neuron.deferred_at, neuron.failing = CHUNK_FAILS, surfaces_at, lambda query: query > 1
    backend = chat_backend(tmp_path / "fallback")
    backend.runner.run()
    assert [t.state for t in backend.runner.tasks] == ["ready"] * len(backend.runner.tasks), \
        [(t.name, t.error) for t in backend.runner.tasks]
    neuron.compiled_queries.clear()
    served = replies(backend)
    assert sorted(r.stats.bucket for r in served) == [32, 64]
    # the prefill ran eager (no compiled call of 32 tokens), every decode step compiled
    assert neuron.compiled_queries == [1] * sum(r.stats.new_tokens - 1 for r in served)
    assert all(r.stats.compiled_graphs == 0 for r in served)  # and nothing compiled after warm-up
    eager = chat_backend(tmp_path / "eager", "--compile", "off")
    eager.runner.run()
    assert [(r.reasoning, r.answer, r.stats.new_tokens) for r in served] == \
        [(r.reasoning, r.answer, r.stats.new_tokens) for r in replies(eager)]


@pytest.mark.slow
@pytest.mark.parametrize("batch", ["1", "2"])
def test_a_failed_prefill_chunk_graph_compiles_once_and_the_status_names_it(neuron, tmp_path, batch):
    neuron.deferred_error, neuron.failing = CHUNK_FAILS, lambda query: query > 1
    backend = chat_backend(tmp_path, "--chat-batch", batch)
    backend.runner.run()
    # the failed chunk graph is not submitted again by bucket 64; the decode graph compiled once
    assert sorted(neuron.compile_attempts) == [1, 32]
    compile_tasks = [t for t in backend.runner.tasks if t.kind == "compile"]
    assert [t.state for t in compile_tasks] == ["ready", "ready"], [(t.name, t.error) for t in compile_tasks]
    status = visitor_status(backend)  # what /status answers
    for task in [t for t in status["tasks"] if t["kind"] == "compile"]:
        assert task["detail"].startswith("eager fallback: the prefill runs eager, the decode compiled"), task
        assert "prefill chunk of 32 tokens over window 256" in task["detail"] and CHUNK_FAILS in task["detail"]
    rows = [row[2] for row in task_rows(status)]
    assert sum("the prefill runs eager, the decode compiled" in row for row in rows) == 2, rows


def test_only_neuron_falls_back_to_eager():
    tiny = parse_settings(["--models", "tiny", "--compile", "on"], env={})
    assert devices.falls_back_to_eager(devices.resolve_placements(tiny, devices.HostDevices(2, 0))["chat"])
    assert not devices.falls_back_to_eager(devices.resolve_placements(tiny, devices.HostDevices(0, 0))["chat"])


def test_status_shows_which_compile_counter_memory_per_core_and_cpu_fallback_ops(neuron, tmp_path, monkeypatch):
    import sys
    import types

    backend = neuron_backend(tmp_path)
    neuron.place([torch.ones(4)], 1)
    counters = backend.status()["counters"]
    assert "TorchNeuron compiled graphs" in counters["compile_counter"]  # no metrics API: the graph counter
    assert set(counters["memory"]) == {"neuron:0", "neuron:1"}
    assert counters["memory"]["neuron:1"]["allocated_bytes"] > 0
    assert counters["memory"]["neuron:1"]["total_bytes"] == fake_neuron.REPORTED_TOTAL  # 24 GiB less the reserve
    values = {"CompilationCache.TotalCompilations": 3, "CompilationCache.PersistentHits": 2,
              "CompilationCache.PersistentMisses": 1}
    metrics = types.SimpleNamespace(is_enabled=lambda: True, set_enabled=lambda on: None,
                                    get_counter_value=values.get)
    neuronx = types.ModuleType("torch_neuronx")
    neuronx.metrics, neuronx.get_fallback_ops = metrics, lambda: ["aten::sort", "aten::sort"]
    monkeypatch.setitem(sys.modules, "torch_neuronx", neuronx)
    monkeypatch.setitem(sys.modules, "torch_neuronx.metrics", metrics)
    counters = backend.status()["counters"]
    assert counters["compile_counter"].startswith("TorchNeuron metrics") and counters["cpu_fallback_ops"] == [
        "aten::sort"]
    assert CompileCounter.graphs() == 5 and CompileCounter.cache_hits() == (2, 1)
    text = "\n".join(counters_lines(counters))
    assert "Compile counter shown:** TorchNeuron metrics" in text and "`aten::sort`" in text
    assert "Memory neuron:1:**" in text


def test_recompile_alarm_counts_eager_neff_compiles_after_warm_up(neuron, tmp_path, monkeypatch):
    import sys
    import types

    values = {"CompilationCache.TotalCompilations": 0, "CompilationCache.PersistentHits": 0}
    metrics = types.SimpleNamespace(is_enabled=lambda: True, set_enabled=lambda on: None,
                                    get_counter_value=values.get)
    neuronx = types.ModuleType("torch_neuronx")
    neuronx.metrics = metrics
    monkeypatch.setitem(sys.modules, "torch_neuronx", neuronx)
    monkeypatch.setitem(sys.modules, "torch_neuronx.metrics", metrics)
    backend = neuron_backend(tmp_path)
    backend.runner._steps = []  # nothing to warm up: the alarm's baseline is now
    backend.runner.run()
    assert backend.status()["compiles_since_ready"] == 0
    values["CompilationCache.TotalCompilations"] = 2  # e.g. a new eager prefill length: no dynamo graph
    assert backend.status()["compiles_since_ready"] == 2


SIDE_GROUP = """
import os, sys, torch.distributed as dist
from tools.parallel import protocol as parallel
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
backend_of = dist.get_backend
dist.get_backend = lambda group=None: "neuron" if group is None else backend_of(group)  # a device default group
parallel._control = parallel.control_group(None)
seen = []
def spy(real):
    def call(obj, src, group=None, **kw):
        seen.append(group is not None and backend_of(group) == "gloo")
        return real(obj, src, group=group, **kw)
    return call
dist.broadcast, dist.broadcast_object_list = spy(dist.broadcast), spy(dist.broadcast_object_list)
parallel.stop_flag(True)
parallel.announce("chat", ("a request of some length",))
print("SEEN", seen)
parallel.close()
"""


@pytest.mark.slow
def test_control_messages_travel_over_a_gloo_side_group():
    import subprocess
    import sys
    from pathlib import Path

    from support.app import free_port

    out = subprocess.run([sys.executable, "-c", SIDE_GROUP, str(free_port())], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "SEEN [True, True]" in out.stdout


def test_startup_log_says_how_many_cores_the_process_holds(neuron, tmp_path, caplog):
    with caplog.at_level("INFO", logger="showcase"):
        neuron_backend(tmp_path)
    assert "2 NeuronCore(s) visible to this process; NEURON_RT_VISIBLE_CORES is unset" in caplog.text
