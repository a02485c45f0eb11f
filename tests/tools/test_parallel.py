"""Tensor parallel under torchrun on CPU (gloo): same output as unsharded, stop in lockstep, followers exit.

Chat runs as shipped. The image transformer runs diffusers' real TensorParallelConfig load and
forward, but only after IMAGE_SCRIPT lifts the two guards that stop it on CPU (see protocol.py):
the app itself refuses --tp-engine image on CPU (test_image_tp_is_refused_on_cpu).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import faulthandler, json, pathlib, sys, torch
    faulthandler.enable()  # a rank that aborts prints its threads' Python stacks (none: after the interpreter)
    torch.set_num_threads(1)
    def report(data):  # a file per rank: ranks printing at once interleave on the shared stdout
        pathlib.Path(sys.argv[3], f"rank{data['rank']}.json").write_text(json.dumps(data))
    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.devices import resolve_placements
    from neuron_backend.runtime import Backend, model_folder
    from neuron_backend.settings import parse_settings
    from neuron_backend.plugins import plug_all
    from tools.demo_models import plugin as demo_builder
    from tools.parallel import plugin, protocol as parallel

    tp = sys.argv[2]
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--no-image", "--tp", tp,
                               "--chat-buckets", "32,64,128", "--context-length", "256",  # 3 warm-up generations
                               "--cache-dir", sys.argv[1]], plugins=(plugin,))
    parts = plug_all((demo_builder, plugin), settings)  # the demo models' builder and the sharding
    placement = resolve_placements(settings, sharding=parts.sharding)["chat"]
    folder = model_folder(settings, "chat", parts.demo_models)  # before the group, as app.py does
    parallel.init(settings, placement)
    if settings.rank != 0:
        served = parallel.run_follower(settings, placement, folder, parts)
        report({"rank": settings.rank, "served": served})
        parallel.end_process()  # as app.py ends a rank
    backend = Backend(settings, parts=parts)
    backend.runner.run()  # the warm-up generations run in lockstep too
    replies = []
    for request in (ChatRequest("hello there", greedy=True, max_new_tokens=12),
                    ChatRequest("tell me a story", temperature=1.0, top_k=0, top_p=1.0, seed=7, max_new_tokens=16),
                    ChatRequest("another", temperature=1.0, seed=123, max_new_tokens=10, history=(
                        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "demo demo"}))):
        replies.append(list(backend.stream_chat(request))[-1].answer)
    stream = backend.stream_chat(ChatRequest("stop me", temperature=1.0, seed=9, max_new_tokens=60))
    next(stream), next(stream)
    stream.close()  # the user stops: every rank must stop at the same token
    replies.append(list(backend.stream_chat(ChatRequest("after the stop", greedy=True, max_new_tokens=6)))[-1].answer)
    status = backend.status()
    parallel.shutdown()
    report({"rank": 0, "replies": replies, "ready": status["ready"],
            "failed": status["failed"], "label": backend.placements["chat"].label()})
    parallel.end_process()
""")


IMAGE_SCRIPT = textwrap.dedent("""
    import faulthandler, hashlib, json, pathlib, sys, threading, torch
    faulthandler.enable()
    torch.set_num_threads(1)
    def report(data):  # a file per rank: ranks printing at once interleave on the shared stdout
        pathlib.Path(sys.argv[3], f"rank{data['rank']}.json").write_text(json.dumps(data))
    from diffusers import Flux2Transformer2DModel, TensorParallelConfig
    from diffusers.hooks import tensor_parallel as tp_hooks
    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.devices import resolve_placements
    from neuron_backend.image.engine import ImageEngine, ImageRequest
    from neuron_backend.runtime import Backend, model_folder
    from neuron_backend.settings import parse_settings
    from neuron_backend.plugins import plug_all
    from tools.demo_models import plugin as demo_builder
    from tools.parallel import plugin, protocol as parallel

    tp = sys.argv[2]
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--tp", tp, "--tp-engine", "image",
                               "--sizes", "64x64,96x64", "--references", "0", "--cache-dir", sys.argv[1]],
                              plugins=(plugin,))
    parts = plug_all((demo_builder, plugin), settings)  # the demo models' builder and the sharding
    placement = resolve_placements(settings, sharding=parts.sharding)["image"]
    folder = model_folder(settings, "image", parts.demo_models)  # before the group, as app.py does
    try:
        parallel.check_supported(settings, placement)
        refusal = None
    except Exception as exc:
        refusal = str(exc)
    # Lift the two CPU guards of diffusers 0.42.1 (protocol.py docstring); nothing else is changed.
    tp_hooks._SUPPORTED_TP_DEVICES += ("cpu",)
    cpu_count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    parallel.init(settings, placement)
    unlifted = None
    if parts.sharding is not None:  # what diffusers does on CPU with only the device list lifted
        torch.accelerator.device_count = cpu_count
        try:
            config = TensorParallelConfig(mesh=parallel.device_mesh(placement))
            Flux2Transformer2DModel.from_pretrained(folder, subfolder="transformer", parallel_config=config)
        except Exception as exc:
            unlifted = f"{type(exc).__name__}: {exc}"
        torch.accelerator.device_count = lambda: 1

    def shard(pipe):
        w = pipe.transformer.transformer_blocks[0].attn.to_q.weight
        local = w.to_local() if hasattr(w, "to_local") else w
        return {"local": list(local.shape), "global": list(w.shape), "placements": str(getattr(w, "placements", None))}

    def digest(image):
        return hashlib.sha256(image.tobytes()).hexdigest()[:16]

    if settings.rank != 0:
        runs, mirror = [], parallel._MIRRORS["image"]
        def spy(engine, payload):  # records what the follower computed, then discards it as usual
            run = mirror(engine, payload)
            runs.append({"steps_done": run.steps_done, "stopped": run.stopped, "image": digest(run.image)})
            return run
        parallel._MIRRORS["image"] = spy
        served = parallel.run_follower(settings, placement, folder, parts)
        report({"rank": settings.rank, "served": served, "runs": runs})
        parallel.end_process()  # as app.py ends a rank
    backend = Backend(settings, parts=parts)
    backend.runner.run()  # the warm-up generations (one per size) run in lockstep too
    results = []
    for request in (ImageRequest("a lighthouse", "64x64", steps=4, seed=7),
                    ImageRequest("a red fox", "96x64", steps=3, seed=123)):
        results.append(backend.generate_image(request))
    stop = threading.Event()
    def press_stop(step, total, elapsed):  # the user stops during step 2 of 6
        if step == 2:
            stop.set()
    results.append(backend.generate_image(ImageRequest("stop me", "64x64", steps=6, seed=9), press_stop, stop))
    results.append(backend.generate_image(ImageRequest("after the stop", "64x64", steps=2, seed=1)))
    # The chat engine runs whole on rank 0: its per-token stop check must not broadcast.
    chat = list(backend.stream_chat(ChatRequest("hello", greedy=True, max_new_tokens=8)))[-1].answer
    status = backend.status()
    engine = backend.engine("image")
    parallel.shutdown()
    report({"rank": 0, "ready": status["ready"], "failed": status["failed"], "refusal": refusal,
            "unlifted": unlifted, "chat": chat, "label": backend.placements["image"].label(),
            "shard": shard(engine._pipe), "paths": [str(r.path) for r in results],
            "images": [digest(r.image) for r in results], "steps_done": [r.params["steps_done"] for r in results],
            "stopped": [r.stopped for r in results]})
    parallel.end_process()
""")


# Where a rank's own failure shows in torchrun's stderr: a Python error, a C++ exception ending the process
# (gloo's IoException when a peer closes its socket: "terminate called ... what(): Connection closed by peer").
CAUSE_WORDS = ("Error", "terminate called", "what()", "Exception", "exitcode", "rank", "Fatal Python error",
               "Thread 0x")


def run(tmp_path, nproc: int, source: str = SCRIPT, timeout: int = 600) -> list[dict]:
    script = tmp_path / "tp_script.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    results = tmp_path / f"results-{nproc}"
    results.mkdir()
    args = [str(script), str(tmp_path / "cache"), str(nproc), str(results)]
    if nproc == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # ranks out of step wait in a collective forever
        # SIGTERM: torchrun then stops its ranks, which run in sessions of their own (a kill would orphan them).
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"{nproc} ranks still running after {timeout} s (out of step?): {stderr[-4000:]}")
    # torchrun's summary fills the tail; the lines that say which rank failed and why may be far above it
    causes = [line for line in stderr.splitlines() if any(word in line for word in CAUSE_WORDS)]
    assert proc.returncode == 0, (stdout[-2000:], causes[-30:], stderr[-4000:])
    return [json.loads((results / f"rank{rank}.json").read_text()) for rank in range(nproc)]


@pytest.mark.slow
@pytest.mark.parity
def test_tensor_parallel_chat_matches_unsharded_and_followers_exit(tmp_path):
    single = run(tmp_path, 1)[0]
    leader, follower = run(tmp_path, 2)
    assert leader["ready"] and not leader["failed"]
    assert "tensor parallel ×2" in leader["label"]
    assert leader["replies"] == single["replies"]  # greedy and seeded sampling alike
    assert all(reply.strip() for reply in leader["replies"])
    # 3 warm-up generations (one per bucket) + 3 replies + the stopped one + 1 after it
    assert follower == {"rank": 1, "served": 8}


def tp_settings(argv, env):
    """The settings with the tensor-parallel plug-in's flags, and its parts (its checks run, as app.py runs them)."""
    from neuron_backend.settings import parse_settings
    from tools.parallel import plugin

    settings = parse_settings(argv, env=env, plugins=(plugin,))
    return settings, plugin.plug(settings)


def test_tp_flag_needs_torchrun():
    from neuron_backend.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--tp: --tp 2 needs 2 processes.*torchrun --nproc_per_node=2"):
        tp_settings(["--models", "tiny", "--tp", "2"], env={})
    s, parts = tp_settings(["--models", "tiny", "--tp", "2"], env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert (parts.sharding.count, s.rank, s.local_rank, s.world_size) == (2, 1, 1, 2)
    with pytest.raises(ConfigError, match="--no-chat"):
        tp_settings(["--models", "tiny", "--tp", "2", "--no-chat"], env={"WORLD_SIZE": "2"})


def test_tp_placement_on_neuron_uses_the_local_core(monkeypatch):
    import types

    import torch

    from neuron_backend.devices import resolve_placements

    monkeypatch.setattr(torch, "neuron", types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2),
                        raising=False)
    s, parts = tp_settings(["--models", "tiny", "--tp", "2"], env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    chat = resolve_placements(s, sharding=parts.sharding)["chat"]
    assert chat.device == "neuron:1" and chat.tp == 2 and chat.process_group_backend == "neuron"


@pytest.mark.slow
@pytest.mark.parity
def test_tensor_parallel_image_matches_unsharded_and_stops_in_lockstep(tmp_path):
    import numpy as np
    from PIL import Image

    single = run(tmp_path, 1, IMAGE_SCRIPT, timeout=300)[0]
    leader, follower = run(tmp_path, 2, IMAGE_SCRIPT, timeout=300)  # about 10 s each here
    assert leader["ready"] and not leader["failed"]
    assert "tensor parallel ×2" in leader["label"]
    assert leader["chat"] == single["chat"] and leader["chat"].strip()  # chat whole on rank 0, not mirrored
    # Without the lifted guards the app refuses, and diffusers itself fails before reading a weight.
    assert "--tp-engine chat" in leader["refusal"] and "on cpu" in leader["refusal"]
    assert leader["unlifted"].startswith("ZeroDivisionError: integer modulo by zero")
    # The transformer was loaded through TensorParallelConfig: each rank holds half of to_q's rows.
    assert leader["shard"] == {"local": [16, 32], "global": [32, 32], "placements": "(Shard(dim=0),)"}
    assert single["shard"]["local"] == [32, 32] and single["unlifted"] is None
    # Same pixels as the unsharded pipeline, up to float rounding in the all-reduce (1 of 255).
    for sharded, whole in zip(leader["paths"], single["paths"], strict=True):
        a, b = (np.asarray(Image.open(p), dtype=np.int16) for p in (sharded, whole))
        assert a.shape == b.shape and np.abs(a - b).max() <= 1
    assert leader["steps_done"] == single["steps_done"] == [4, 3, 2, 2]
    assert leader["stopped"] == [False, False, True, False]
    # The follower ran every call with rank 0: the 2 warm-ups, the same images, the same stop step.
    assert follower["rank"] == 1 and follower["served"] == 6
    assert [r["steps_done"] for r in follower["runs"]] == [1, 1, 4, 3, 2, 2]
    assert [r["stopped"] for r in follower["runs"]] == [False, False, False, False, True, False]
    assert [r["image"] for r in follower["runs"][2:]] == leader["images"]


@pytest.mark.slow
def test_ctrl_c_stops_a_tensor_parallel_app_on_every_rank(tmp_path, demo_models):
    """``torchrun ... app.py --tp 2``, one reply, then Ctrl-C (SIGINT to the terminal's whole process group):
    rank 0 closes the page and releases the follower, which exits; no rank fails. Before, the follower stopped
    on the Ctrl-C itself and rank 0's release failed with "Connection closed by peer" (tracebacks on both ranks).
    torchrun itself still reports the signal and exits 1, as it does for any Ctrl-C."""
    from gradio_client import Client
    from support.app import free_port, link_demo_models
    from support.browser import _wait_for_http

    link_demo_models(tmp_path, demo_models)
    port, log_path = free_port(), tmp_path / "torchrun.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "app.py",
           "--models", "tiny", "--device", "cpu", "--no-image", "--tp", "2", "--port", str(port),
           "--cache-dir", str(tmp_path)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/readyz", proc, log_path, timeout_s=300)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        # Greedy, as in the chat test above: a sampled reply of the demo model may be empty.
        reply = client.predict("hello there", greedy=True, max_new_tokens=12, api_name="/chat")
        assert reply["answer"].strip() and reply["stats"]["new_tokens"] > 0
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log_path.read_text(errors="replace")
    assert "followers released" in out, out[-4000:]
    assert re.search(r"rank 1 served [1-9]\d* chat generations and exits", out), out[-4000:]
    assert "[rank" not in out and "Connection closed by peer" not in out, out[-4000:]  # a rank's own traceback


END_SCRIPT = textwrap.dedent("""
    import atexit, json, os, pathlib, sys, torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from tools.parallel import protocol as parallel

    def gloo_threads():
        names = [pathlib.Path(f"/proc/self/task/{task}/comm").read_text() for task in os.listdir("/proc/self/task")]
        return sum(name.startswith("pt_gloo") for name in names)

    out = pathlib.Path(sys.argv[1])
    dist.init_process_group("gloo", init_method=f"file://{out / 'rendezvous'}", rank=0, world_size=1)
    weight = distribute_tensor(torch.ones(4, 4), DeviceMesh("cpu", [0]), [Shard(0)])  # as a sharded weight is
    del weight
    parallel.close()
    threads = {"after_destroy": gloo_threads()}
    atexit.register(lambda: (out / "atexit.json").write_text(json.dumps(threads)))
    print("flushed by end_process", end="")  # no newline: still in the buffer of a piped stdout
    parallel.end_process(3)
""")


def test_a_rank_ends_with_its_exit_handlers_though_its_sharded_group_outlives_destroy(tmp_path):
    """end_process finishes as the interpreter would (atexit handlers, flushed streams) with the rank's code.
    It exists because of the torch behaviour asserted last: a group that DTensor used keeps its gloo threads
    after destroy_process_group (their teardown at exit is what aborted a rank now and then)."""
    proc = subprocess.run([sys.executable, "-c", END_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout == "flushed by end_process"
    threads = json.loads((tmp_path / "atexit.json").read_text())
    assert threads["after_destroy"] > 0  # the group's threads (pt_gloo_runloop), still there


def test_image_tp_is_refused_on_cpu(tmp_path):
    """diffusers 0.42.1 cannot shard on CPU: the app says so at start, before joining any process group."""
    import torch.distributed as dist

    from neuron_backend.devices import resolve_placements
    from neuron_backend.errors import ConfigError
    from tools.parallel import protocol as parallel

    s, parts = tp_settings(["--models", "tiny", "--device", "cpu", "--tp", "2", "--tp-engine", "image",
                            "--cache-dir", str(tmp_path)], env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    placements = resolve_placements(s, sharding=parts.sharding)
    assert placements["image"].tp == 2 and placements["chat"].tp == 1  # only the named engine is sharded
    refused = r"--tp-engine: .*cannot shard the image transformer on cpu.*allowed: --tp-engine chat"
    with pytest.raises(ConfigError, match=refused):
        parallel.init(s, placements["image"])
    assert not dist.is_initialized()


def test_torchrun_with_neuron_rt_visible_cores_exported_is_refused_at_start_with_the_fix(monkeypatch):
    from support import fake_neuron

    from neuron_backend.devices import HostDevices, resolve_placements
    from neuron_backend.errors import ConfigError

    fake_neuron.install(monkeypatch, torchrun=(0, 2))  # rank 0 of 2, as torchrun starts it
    torchrun = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    host = HostDevices(neuron_cores=2, cuda_devices=0, visible_cores="0-1")
    exported, parts = tp_settings(["--models", "tiny", "--tp", "2"], env={**torchrun, "NEURON_RT_VISIBLE_CORES": "0-1"})
    fix = r"env -u NEURON_RT_VISIBLE_CORES torchrun --nproc_per_node=2 app.py --tp 2"
    refused = r"NEURON_RT_VISIBLE_CORES: is exported as '0-1'.*one device per process.*"
    with pytest.raises(ConfigError, match=refused + fix):
        resolve_placements(exported, host, sharding=parts.sharding)
    unset, parts = tp_settings(["--models", "tiny", "--tp", "2"], env=torchrun)  # TorchNeuron sets it per rank itself
    assert resolve_placements(unset, HostDevices(2, 0, visible_cores="0"), sharding=parts.sharding)["chat"].device \
        == "neuron:0"
    one, _ = tp_settings(["--models", "tiny"], env={"NEURON_RT_VISIBLE_CORES": "0-1"})  # no torchrun: as documented
    assert resolve_placements(one, host)["chat"].kind == "neuron"


def test_one_process_never_enters_tensor_parallel(warm_app, monkeypatch):
    """Tensor parallel's protocol is handed to the engines only under --tp: a single-process chat reply and
    image (a stop check every token and every step) call nothing in protocol.py."""
    import inspect

    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.image.engine import ImageRequest
    from tools.parallel import protocol as parallel

    entered = []
    for name, fn in list(vars(parallel).items()):
        if inspect.isfunction(fn) and fn.__module__ == parallel.__name__:
            def spy(*args, _name=name, _fn=fn, **kwargs):
                entered.append(_name)
                return _fn(*args, **kwargs)

            monkeypatch.setattr(parallel, name, spy)
    backend, _ = warm_app
    reply = list(backend.stream_chat(ChatRequest(message="hello", max_new_tokens=4, greedy=True)))[-1]
    assert reply.done and reply.stats.new_tokens == 4
    assert backend.generate_image(ImageRequest("a fox", "64x64", steps=2, seed=0)).image.size == (64, 64)
    assert entered == []


SINGLE_SCRIPT = textwrap.dedent("""
    import sys
    from app import PLUGINS
    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.plugins import plug_all
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings

    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--no-image", "--chat-buckets", "48",
                               "--context-length", "64", "--cache-dir", sys.argv[1]], env={}, plugins=PLUGINS)
    backend = Backend(settings, parts=plug_all(PLUGINS, settings))
    backend.runner.run()
    reply = list(backend.stream_chat(ChatRequest("hello", greedy=True, max_new_tokens=4)))[-1]
    assert reply.done, reply
    print(",".join(sorted(name for name in sys.modules if name.startswith("tools.parallel"))))
""")


def test_one_process_never_imports_the_protocol(tmp_path):
    """A single-process app (every plug-in, --tp left out) loads, warms up and replies without importing
    ``tools/parallel/protocol.py`` (nor torch.distributed through it)."""
    proc = subprocess.run([sys.executable, "-c", SINGLE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = proc.stdout.strip().splitlines()[-1].split(",")
    assert "tools.parallel.plugin" in imported  # the plug-in itself is listed in app.PLUGINS
    assert "tools.parallel.protocol" not in imported
