"""Prometheus metrics of one Backend (``prometheus_client``), served as ``GET /metrics`` by the UI.

Each Backend has its own ``CollectorRegistry``, so several backends (tests) live in one process.
Request outcomes and latencies are observed once per request in ``Backend`` methods, never per
token or per denoising step; the warm-up tasks, engine states and the recompile alarm are read
from the warm-up runner when Prometheus scrapes, so they cost nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .errors import CancelledError, ShowcaseError

CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no *_created series: start times of each label set are noise on a dashboard
ENGINE_STATES = ("disabled", "loading", "ready", "failed")
OUTCOMES = ("ok", "cancelled", "rejected", "error")  # rejected: a ShowcaseError the user can fix or retry
# Seconds: the tiny CPU models take milliseconds, a cold Neuron prefill seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
IMAGE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class Metrics:
    """The counters and histograms a Backend updates, plus a collector that reads its warm-up at scrape time.

    Thread-safe: prometheus_client metrics take their own locks; ``queue_depth`` is a plain callable
    the UI sets (Gradio's queue), read only while scraping.
    """

    def __init__(self, tasks: Callable[[], list], engine_states: Callable[[], dict[str, str]],
                 compiles_since_ready: Callable[[], int]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("showcase_requests", "Engine requests by endpoint (chat, image) and outcome "
                                "(ok, cancelled, rejected: an error the user can fix or retry, error)",
                                ["endpoint", "outcome"], registry=r)
        self.in_progress = Gauge("showcase_requests_in_progress", "Engine requests waiting for or running on an "
                                 "engine", ["endpoint"], registry=r)
        self.ttft = Histogram("showcase_chat_time_to_first_token_seconds", "Chat: start of generate() to the "
                              "first new token (includes the prefill)", buckets=TTFT_BUCKETS, registry=r)
        self.tokens_per_s = Histogram("showcase_chat_tokens_per_second", "Chat: decode speed after the first "
                                      "token, per reply", buckets=TOKENS_PER_S_BUCKETS, registry=r)
        self.new_tokens = Counter("showcase_chat_new_tokens", "Chat: tokens generated", registry=r)
        self.image_seconds = Histogram("showcase_image_seconds", "Image: generation time per precompiled size",
                                       ["size"], buckets=IMAGE_BUCKETS, registry=r)
        self.v1_requests = Counter("showcase_v1_requests", "OpenAI-compatible /v1 requests by route (models, chat, "
                                   "images, files) and HTTP status", ["route", "status"], registry=r)
        self.v1_errors = Counter("showcase_v1_errors", "/v1 requests answered with an error, by route and OpenAI "
                                 "error type", ["route", "type"], registry=r)
        self.v1_tokens = Counter("showcase_v1_tokens", "/v1 chat tokens by kind (prompt, completion)", ["kind"],
                                 registry=r)
        self.feedback = Counter("showcase_feedback_marks", "Chat replies marked by users", ["rating"], registry=r)
        for endpoint in ("chat", "image"):  # export zeros before the first request
            self.in_progress.labels(endpoint)
            for outcome in OUTCOMES:
                self.requests.labels(endpoint, outcome)
        for kind in ("prompt", "completion"):
            self.v1_tokens.labels(kind)
        self.queue_depth: Callable[[], int] | None = None
        r.register(_StateCollector(self, tasks, engine_states, compiles_since_ready))

    def track(self, endpoint: str) -> _Tracked:
        """``with metrics.track("chat") as t:`` counts the request once with its outcome (``t.outcome``
        may be set to "cancelled" by the caller for a request stopped without an exception)."""
        return _Tracked(self, endpoint)

    def observe_chat(self, stats) -> None:
        """One finished reply's ChatStats."""
        if stats.time_to_first_token_s is not None:
            self.ttft.observe(stats.time_to_first_token_s)
        if stats.new_tokens > 1 and stats.tokens_per_s > 0:
            self.tokens_per_s.observe(stats.tokens_per_s)
        self.new_tokens.inc(stats.new_tokens)

    def observe_image(self, size: str, seconds: float) -> None:
        self.image_seconds.labels(size).observe(seconds)

    def observe_v1(self, route: str, status: int, error_type: str | None = None) -> None:
        """One answered /v1 request (an error also under its OpenAI error type)."""
        self.v1_requests.labels(route, str(status)).inc()
        if error_type is not None:
            self.v1_errors.labels(route, error_type).inc()

    def observe_v1_tokens(self, prompt: int, completion: int) -> None:
        self.v1_tokens.labels("prompt").inc(prompt)
        self.v1_tokens.labels("completion").inc(completion)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class _Tracked:
    """Counts one request: in progress while inside, then its outcome (the exception decides, if any)."""

    def __init__(self, metrics: Metrics, endpoint: str):
        self.metrics, self.endpoint, self.outcome = metrics, endpoint, "ok"

    def chat(self, updates: Iterable) -> Iterator:
        """Pass a reply's updates through; observe the final one's stats (a stopped reply: cancelled)."""
        for update in updates:
            if update.stats is not None:
                self.metrics.observe_chat(update.stats)
                self.outcome = "cancelled" if update.stats.stopped else "ok"
            yield update

    def images(self, results: list) -> list:
        """Observe each ImageResult's seconds under its size; a stopped run counts as cancelled."""
        for result in results:
            self.metrics.observe_image(str(result.params.get("size")), result.seconds)
            if result.stopped:
                self.outcome = "cancelled"
        return results

    def __enter__(self) -> _Tracked:
        self.metrics.in_progress.labels(self.endpoint).inc()
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is GeneratorExit or (kind is not None and issubclass(kind, CancelledError)):
            self.outcome = "cancelled"  # GeneratorExit: the client went away mid-stream
        elif kind is not None and issubclass(kind, ShowcaseError):
            self.outcome = "rejected"
        elif kind is not None:
            self.outcome = "error"
        self.metrics.in_progress.labels(self.endpoint).dec()
        self.metrics.requests.labels(self.endpoint, self.outcome).inc()


class _StateCollector:
    """Warm-up tasks, engine states, the recompile alarm and the queue depth, read when scraped."""

    def __init__(self, metrics: Metrics, tasks, engine_states, compiles_since_ready):
        self._metrics, self._tasks, self._states, self._compiles = metrics, tasks, engine_states, compiles_since_ready

    def describe(self) -> Iterable:
        return []  # metrics are produced at collect time only

    def collect(self) -> Iterable[GaugeMetricFamily]:
        tasks = self._tasks()
        seconds = GaugeMetricFamily("showcase_warmup_task_seconds", "Warm-up task duration (elapsed while "
                                    "running)", labels=["engine", "kind", "shape", "state"])
        for t in tasks:
            if t.seconds is not None:
                seconds.add_metric([t.engine, t.kind, t.shape or "", t.state], t.seconds)
        yield seconds
        states = GaugeMetricFamily("showcase_warmup_tasks", "Warm-up tasks by state", labels=["state"])
        for state in ("queued", "running", "ready", "failed", "skipped"):
            states.add_metric([state], sum(t.state == state for t in tasks))
        yield states
        yield GaugeMetricFamily("showcase_warmup_cache_hits", "Compile tasks served from the persistent compile "
                                "cache", value=sum(bool(t.cache_hit) for t in tasks))
        yield GaugeMetricFamily("showcase_compiles_since_ready", "Graph compiles after warm-up ended (the "
                                "recompile alarm; should stay 0)", value=self._compiles())
        engine = GaugeMetricFamily("showcase_engine_state", "Engine state (1 for the current one)",
                                   labels=["engine", "state"])
        for name, current in self._states().items():
            for state in ENGINE_STATES:
                engine.add_metric([name, state], 1.0 if state == current else 0.0)
        yield engine
        depth = self._metrics.queue_depth
        if depth is not None:
            yield GaugeMetricFamily("showcase_queue_depth", "Requests waiting in the web queue", value=depth())


def readiness(tasks: list) -> tuple[bool, dict]:
    """Whether every enabled engine serves every declared shape (every warm-up task ended ready), and a
    small JSON body saying what is still warming, what failed, and warnings: task names and fixed
    sentences only, never paths or errors.

    The compile-cache bundle (``--cache-bundle``) only saves compile time: when it fails to install
    (unreadable, tampered, or made for other software) the engines compile without it, so its failure
    is a warning in the body, never unreadiness. A failed or skipped engine task still is.
    """
    warming = [t.name for t in tasks if t.state in ("queued", "running")]
    ended_badly = [t for t in tasks if t.state in ("failed", "skipped")]
    failed = [t.name for t in ended_badly if t.kind != "bundle"]
    warnings = [f"{t.name}: {t.state}; the engines warm up without the bundle (details in /status)"
                for t in ended_badly if t.kind == "bundle"]
    ready = not warming and not failed
    return ready, {"ready": ready, "done": sum(t.state == "ready" for t in tasks), "total": len(tasks),
                   "warming": warming, "failed": failed, "warnings": warnings}
