"""What /metrics reads when Prometheus scrapes: warm-up tasks, engine states, build facts, the recompile alarm and
the queue depth, in the Backend's registry (``state_series``: registered once per Backend via ``Metrics.own``).

Each warm-up task keeps the same series through its transitions. The series: docs/api.md, "Metrics".
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily

from neuron_backend.metrics import Metrics

ENGINE_STATES = ("disabled", "loading", "ready", "failed")
TASK_STATES = ("queued", "running", "ready", "failed", "skipped")
BUILD_LABELS = ("chat_model", "image_model", "device", "dtype", "torch", "torch_neuronx", "gradio", "version")


class StateCollector:
    """Warm-up tasks, engine states, build facts, the recompile alarm and the queue depth, read when scraped.

    Each warm-up task is named by (engine, kind, shape) in every series from the first scrape on: its
    state is one 0/1 series per state, its durations are 0 until it starts, so a transition changes
    values, never the set of series. ``build_info``: the values of ``BUILD_LABELS``, read at each scrape (a
    fallback to a demo model changes what runs).
    """

    def __init__(self, metrics: Metrics, tasks: Callable[[], list], engine_states: Callable[[], dict[str, str]],
                 compiles_since_ready: Callable[[], int], build_info: Callable[[], dict[str, str]] | None = None):
        self._metrics, self._tasks, self._states, self._compiles = metrics, tasks, engine_states, compiles_since_ready
        self._build_info = build_info

    def describe(self) -> Iterable:
        return []  # metrics are produced at collect time only

    def collect(self) -> Iterable[GaugeMetricFamily]:
        tasks, now = self._tasks(), time.time()
        task_labels = ["engine", "kind", "shape"]
        seconds = GaugeMetricFamily("showcase_warmup_task_seconds", "Warm-up task duration: elapsed while "
                                    "running, final once ended, 0 while queued", labels=task_labels)
        running = GaugeMetricFamily("showcase_warmup_task_running_seconds", "Seconds the warm-up task has been "
                                    "running (0 unless running): a long compile shows while it runs",
                                    labels=task_labels)
        state = GaugeMetricFamily("showcase_warmup_task_state", "Warm-up task state (1 for the current one)",
                                  labels=[*task_labels, "state"])
        for t in tasks:
            key = [t.engine, t.kind, t.shape or ""]
            live = max(0.0, now - t.started_at) if t.state == "running" and t.started_at else None
            seconds.add_metric(key, live if live is not None else t.seconds or 0.0)
            running.add_metric(key, live or 0.0)
            for name in TASK_STATES:
                state.add_metric([*key, name], 1.0 if t.state == name else 0.0)
        yield from (seconds, running, state)
        states = GaugeMetricFamily("showcase_warmup_tasks", "Warm-up tasks by state", labels=["state"])
        for name in TASK_STATES:
            states.add_metric([name], sum(t.state == name for t in tasks))
        yield states
        yield GaugeMetricFamily("showcase_warmup_cache_hits", "Compile tasks served from the persistent compile "
                                "cache", value=sum(bool(t.cache_hit) for t in tasks))
        yield GaugeMetricFamily("showcase_compiles_since_ready", "Graph compiles after warm-up ended (the "
                                "recompile alarm; should stay 0)", value=self._compiles())
        engine = GaugeMetricFamily("showcase_engine_state", "Engine state (1 for the current one)",
                                   labels=["engine", "state"])
        for name, current in self._states().items():
            for engine_state in ENGINE_STATES:
                engine.add_metric([name, engine_state], 1.0 if engine_state == current else 0.0)
        yield engine
        if self._build_info is not None:
            facts = self._build_info()
            info = GaugeMetricFamily("showcase_build_info", "What this server runs: models, device, dtype and "
                                     "versions (always 1)", labels=list(BUILD_LABELS))
            info.add_metric([str(facts.get(name) or "") for name in BUILD_LABELS], 1.0)
            yield info
        depth = self._metrics.queue_depth
        if depth is not None:
            yield GaugeMetricFamily("showcase_queue_depth", "Requests waiting in the web queue", value=depth())


def state_series(backend) -> StateCollector:
    """``backend``'s scrape-time series, registered in its registry on the first call (the same after)."""

    def make(metrics: Metrics) -> StateCollector:
        collector = StateCollector(metrics, lambda: backend.runner.tasks, backend.engine_states,
                                   backend.runner.compiles_since_ready, lambda: build_info(backend))
        metrics.registry.register(collector)
        return collector

    return backend.metrics.own("probes", make)


def build_info(backend) -> dict[str, str]:
    """What ``showcase_build_info`` says runs here: models, device, dtype, versions."""
    versions = backend.description["versions"]

    def per_engine(values: dict[str, str]) -> str:  # one value when every engine agrees
        distinct = set(values.values())
        return distinct.pop() if len(distinct) == 1 else ",".join(f"{k}={v}" for k, v in values.items())

    return {"chat_model": str(backend.model_id("chat")) if "chat" in backend.placements else "",
            "image_model": str(backend.model_id("image")) if "image" in backend.placements else "",
            "device": per_engine({name: p.device for name, p in backend.placements.items()}),
            "dtype": per_engine({name: p.dtype_name for name, p in backend.placements.items()}),
            "torch": versions.get("torch", ""), "torch_neuronx": versions.get("torch_neuronx", ""),
            "gradio": versions.get("gradio", ""), "version": app_version()}


def app_version(pyproject: Path = Path(__file__).resolve().parents[2] / "pyproject.toml") -> str:
    """The project's version as pyproject.toml declares it ("unknown" without one)."""
    try:
        match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.MULTILINE)
    except OSError:
        match = None
    return match.group(1) if match else "unknown"
