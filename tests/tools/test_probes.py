"""The probes plug-in (tools/probes): /readyz per shape and as a whole on the Backend's warm-up, and the series
/metrics reads when scraped (warm-up tasks that keep their labels through transitions, a running task's live
duration, build facts, the queue depth), every scrape parsed by prometheus_client's own text parser. The served
probes (with and without --auth): tests/ui/test_clients.py, tests/tools/test_login.py, tests/tools/test_mcp.py."""

from __future__ import annotations

import math
import time

import gradio
import pytest
import torch
from starlette.applications import Starlette
from starlette.testclient import TestClient
from support.scrape import scrape, value

from neuron_backend.metrics import Metrics
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from neuron_backend.warmup import Step, Task
from tools.demo_models import plugin as demo_builder
from tools.probes import plugin as probes
from tools.probes.collector import StateCollector, app_version


def make_backend(tmp_path, *extra):
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path),
                               "--sizes", "64x64,96x64", "--chat-buckets", "32,64,128", "--context-length", "256",
                               "--references", "0", *extra], env={})
    return Backend(settings, parts=demo_builder.plug(settings))


def task_series(samples: dict) -> set:
    return {key for key in samples if key[0].startswith("showcase_warmup_task_")}


# ----- /readyz ------------------------------------------------------------------------------------------------
def probe_client(backend):
    """An HTTP client of the probe routes the app serves, on their own Starlette app."""
    return TestClient(Starlette(routes=probes.routes(backend)))


@pytest.mark.slow
def test_readyz_answers_per_shape_while_one_engine_failed_and_a_size_compiles(tmp_path, demo_models, monkeypatch):
    import threading

    from support.app import link_demo_models

    from neuron_backend.chat.engine import ChatEngine

    def broken(self, folder):
        raise OSError("model.safetensors is truncated at /secret/path")

    monkeypatch.setattr(ChatEngine, "load", broken)  # chat fails to load: its shapes are skipped
    link_demo_models(tmp_path, demo_models)
    # image's first size, chat's weights, load (failed) and first bucket (skipped), then image's 96x64 (held)
    # ahead of chat's other buckets: the warm-up has yet to reach and skip those when the probe asks
    backend = make_backend(tmp_path, "--warmup-order", "image,chat")
    held, release = next(s for s in backend.runner._steps if s.task.shape == "96x64"), threading.Event()
    warm_up = held.run
    held.run = lambda task: (release.wait(60), warm_up(task))  # the last size stays compiling until released
    backend.start()
    try:
        deadline = time.monotonic() + 120
        while held.task.state != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.task.state == "running"
        probe = probe_client(backend)
        ready = probe.get("/readyz", params={"shape": "64x64"})
        assert ready.status_code == 200
        assert ready.json() == {"ready": True, "engine": "image", "shape": "64x64", "state": "ready", "eta_s": 0.0}
        compiling = probe.get("/readyz", params={"shape": "96x64", "engine": "image"})
        assert compiling.status_code == 503
        body = compiling.json()
        assert (body["ready"], body["engine"], body["shape"], body["state"]) == (False, "image", "96x64", "running")
        assert isinstance(body["eta_s"], float) and body["eta_s"] >= 0  # learned from 64x64's time this run
        assert compiling.headers["retry-after"] == str(max(1, math.ceil(body["eta_s"])))  # when to ask again
        assert "retry-after" not in ready.headers
        assert [t.state for t in backend.runner.tasks if t.engine == "chat" and t.kind == "compile"] == \
            ["skipped", "queued", "queued"]
        for shape in ("prefill-32", "prefill-64"):  # its engine failed: skipped, or yet to be skipped
            failed = probe.get("/readyz", params={"shape": shape})
            assert failed.status_code == 503
            assert failed.json() == {"ready": False, "engine": "chat", "shape": shape, "state": "failed",
                                     "eta_s": None}
        assert [probe.head("/readyz", params={"shape": s}).status_code for s in ("64x64", "96x64", "prefill-32")] \
            == [200, 503, 503]

        plain = probe.get("/readyz")
        assert plain.status_code == 503 and probe.head("/readyz").status_code == 503
        body = plain.json()
        assert set(body) == {"ready", "done", "total", "warming", "failed", "warnings", "shapes"}
        assert body["ready"] is False and held.task.name in body["warming"]
        gone, eta = {"state": "failed", "eta_s": None}, body["shapes"]["image"]["96x64"]["eta_s"]
        assert body["shapes"] == {"chat": {"prefill-32": gone, "prefill-64": gone, "prefill-128": gone},
                                  "image": {"64x64": {"state": "ready", "eta_s": 0.0},
                                            "96x64": {"state": "running", "eta_s": eta}}}
        assert isinstance(eta, float) and eta >= 0
        assert "truncated" not in plain.text and "/secret" not in plain.text and str(tmp_path) not in plain.text
    finally:
        release.set()
        assert backend.runner.wait(120)
    assert probe.get("/readyz", params={"shape": "96x64"}).status_code == 200
    assert probe.get("/readyz").status_code == 503  # chat still does not serve


def test_readyz_names_what_is_declared_for_a_shape_it_does_not_know(tmp_path):
    probe = probe_client(make_backend(tmp_path))
    unknown = probe.get("/readyz", params={"shape": "512x512"})
    assert unknown.status_code == 404 and probe.head("/readyz", params={"shape": "512x512"}).status_code == 404
    assert unknown.json()["detail"] == ("shape '512x512' is not declared on this server; declared shapes: "
                                        "chat: prefill-32, prefill-64, prefill-128; image: 64x64, 96x64.")
    assert unknown.json()["declared"] == {"chat": ["prefill-32", "prefill-64", "prefill-128"],
                                          "image": ["64x64", "96x64"]}
    other = probe.get("/readyz", params={"shape": "prefill-32", "engine": "image"})
    assert other.status_code == 404
    assert other.json()["detail"] == ("shape 'prefill-32' is not declared by the image engine on this server; "
                                      "declared shapes: 64x64, 96x64.")
    queued = probe.get("/readyz", params={"shape": "prefill-32", "engine": "chat"})
    assert queued.status_code == 503 and queued.json()["state"] == "queued"
    bad = probe.get("/readyz", params={"shape": "64x64", "engine": "gpu"})
    assert bad.status_code == 400 and "allowed: engine=chat or engine=image" in bad.json()["detail"]
    alone = probe.get("/readyz", params={"engine": "chat"})
    assert alone.status_code == 400 and "engine= needs shape=" in alone.json()["detail"]

    image_only = probe_client(make_backend(tmp_path / "image-only", "--no-chat"))
    disabled = image_only.get("/readyz", params={"shape": "prefill-32", "engine": "chat"})
    assert disabled.status_code == 404
    assert disabled.json()["detail"] == ("the chat engine is not enabled on this server (--no-chat); "
                                         "enabled engines: image.")
    assert list(image_only.get("/readyz").json()["shapes"]) == ["image"]


def test_readyz_asks_which_engine_when_both_declare_a_shape(tmp_path):
    backend = make_backend(tmp_path)
    # Today's labels never meet (chat's read "prefill-N"); a chat task labelled as an image size stands in for
    # two engines that declare the same label, so the route must not guess.
    backend.runner._steps.append(Step(Task("chat · 64x64", "chat", "compile", "64x64"), lambda task: None, "same"))
    probe = probe_client(backend)
    both = probe.get("/readyz", params={"shape": "64x64"})
    assert both.status_code == 400 and probe.head("/readyz", params={"shape": "64x64"}).status_code == 400
    assert both.json()["detail"] == ("shape '64x64' is declared by both the chat and the image engine: "
                                     "add engine=chat or engine=image.")
    chosen = probe.get("/readyz", params={"shape": "64x64", "engine": "image"})
    assert chosen.status_code == 503 and chosen.json()["engine"] == "image"


# ----- the series read when scraped ------------------------------------------------------------------
def test_a_warm_up_task_keeps_its_series_through_every_transition():
    tasks = [Task("chat · load", "chat", "load"), Task("image · 64x64", "image", "compile", "64x64")]
    metrics = Metrics()
    metrics.registry.register(StateCollector(metrics, lambda: tasks, lambda: {"chat": "loading", "image": "loading"},
                                             lambda: 0))
    compile_task = tasks[1]
    seen = []
    for state in ("queued", "running", "ready"):
        if state == "running":
            compile_task.state, compile_task.started_at = "running", time.time() - 40 * 60  # a 40-minute compile
        elif state == "ready":
            compile_task.state, compile_task.seconds = "ready", 2400.0
        samples = scrape(metrics)
        seen.append(task_series(samples))
        labels = {"engine": "image", "kind": "compile", "shape": "64x64"}
        for name in ("queued", "running", "ready", "failed", "skipped"):
            assert value(samples, "showcase_warmup_task_state", **labels, state=name) == (name == state)
        running = value(samples, "showcase_warmup_task_running_seconds", **labels)
        duration = value(samples, "showcase_warmup_task_seconds", **labels)
        if state == "running":  # visible while it runs, not only once it ends
            assert 40 * 60 <= running < 40 * 60 + 60 and duration == running
        else:
            assert running == 0 and duration == (2400.0 if state == "ready" else 0)
    assert seen[0] == seen[1] == seen[2]  # the same names and labels before and after each transition
    assert len(seen[0]) == 2 * (2 + 5)  # per task: seconds, running seconds, five states


def test_build_info_says_what_runs(tiny_settings):
    backend = Backend(tiny_settings)
    for _ in range(2):  # each page served for one Backend builds its routes: the series are registered once
        probes.routes(backend)
    samples = scrape(backend.metrics)
    info = [dict(labels) for (name, labels), v in samples.items() if name == "showcase_build_info" and v == 1]
    assert len(info) == 1
    assert info[0] == {"chat_model": "demo Qwen3 (tiny, random weights)",
                       "image_model": "demo FLUX.2-klein (tiny, random weights)", "device": "cpu",
                       "dtype": backend.placements["chat"].dtype_name, "torch": torch.__version__,
                       "torch_neuronx": "", "gradio": gradio.__version__, "version": app_version()}
    assert app_version() not in ("", "unknown")
    assert value(samples, "showcase_compiles_since_ready") == 0
    assert value(samples, "showcase_engine_state", engine="chat", state="loading") == 1
    assert value(samples, "showcase_queue_depth") is None  # until ui.serve sets the queue gauge
    backend.metrics.queue_depth = lambda: 3
    assert value(scrape(backend.metrics), "showcase_queue_depth") == 3
