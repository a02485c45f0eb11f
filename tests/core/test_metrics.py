"""The metrics' exposition on its own: warm-up task series that keep their labels through transitions, a
running task's live duration, refusal labels, build facts; every scrape parsed by prometheus_client's own
text parser (promtool, a Go binary, is not installed here)."""

from __future__ import annotations

import time

import gradio
import torch
from prometheus_client.parser import text_string_to_metric_families

from neuron_backend.errors import (
    BusyError,
    CancelledError,
    EngineUnavailableError,
    InvalidRequestError,
    ShapeFailedError,
    ShapeNotReadyError,
    ShowcaseError,
    UnsupportedSizeError,
)
from neuron_backend.metrics import REFUSAL_REASONS, Metrics, app_version, refusal_reason
from neuron_backend.runtime import Backend
from neuron_backend.warmup import Task


def scrape(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """Every sample of one scrape, keyed by (name, sorted labels); the text must parse."""
    samples = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples


def task_series(samples: dict) -> set:
    return {key for key in samples if key[0].startswith("showcase_warmup_task_")}


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_a_warm_up_task_keeps_its_series_through_every_transition():
    tasks = [Task("chat · load", "chat", "load"), Task("image · 64x64", "image", "compile", "64x64")]
    metrics = Metrics(lambda: tasks, lambda: {"chat": "loading", "image": "loading"}, lambda: 0)
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


def test_refusals_have_a_fixed_reason_set():
    assert refusal_reason(UnsupportedSizeError("x")) == refusal_reason(InvalidRequestError("x")) == "bad_input"
    assert refusal_reason(BusyError("x")) == "busy"
    assert refusal_reason(ShapeNotReadyError("x", "64x64")) == refusal_reason(EngineUnavailableError("x")) \
        == "not_ready"
    assert refusal_reason(ShapeFailedError("x")) == "failed_shape"
    assert refusal_reason(ShowcaseError("anything")) == "other"
    assert refusal_reason(CancelledError("x")) is None  # a cancel is no refusal
    metrics = Metrics(lambda: [], dict, lambda: 0)
    metrics.refused("/chat", "bad_input")
    metrics.refused("/chat", "a free text that must not become a label")
    samples = scrape(metrics)
    assert value(samples, "showcase_refusals_total", endpoint="/chat", reason="bad_input") == 1
    assert value(samples, "showcase_refusals_total", endpoint="/chat", reason="other") == 1
    assert {dict(k[1])["reason"] for k in samples if k[0] == "showcase_refusals_total"} <= set(REFUSAL_REASONS)


def test_build_info_says_what_runs(tiny_settings):
    backend = Backend(tiny_settings)
    samples = scrape(backend.metrics)
    info = [dict(labels) for (name, labels), v in samples.items() if name == "showcase_build_info" and v == 1]
    assert len(info) == 1
    assert info[0] == {"chat_model": "demo Qwen3 (tiny, random weights)",
                       "image_model": "demo FLUX.2-klein (tiny, random weights)", "device": "cpu",
                       "dtype": backend.placements["chat"].dtype_name, "torch": torch.__version__,
                       "torch_neuronx": "", "gradio": gradio.__version__, "version": app_version()}
    assert app_version() not in ("", "unknown")
    # zeros before the first request: rate() and histogram_quantile() work from the first scrape
    assert value(samples, "showcase_request_duration_seconds_count", endpoint="/chat") == 0
    assert value(samples, "showcase_queue_wait_seconds_count", endpoint="chat_tab") == 0


def test_a_plug_ins_own_series_are_made_once_per_registry():
    from prometheus_client import Counter

    metrics, made = Metrics(lambda: [], dict, lambda: 0), []

    def make(m):
        made.append(m)
        return Counter("showcase_plugged", "A plug-in's counter", registry=m.registry)

    first = metrics.own("plugged", make)
    assert metrics.own("plugged", make) is first and made == [metrics]  # a second registration would raise
    first.inc()
    assert b"showcase_plugged_total 1.0" in metrics.exposition()
