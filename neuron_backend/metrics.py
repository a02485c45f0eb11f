"""Prometheus metrics of one Backend (``prometheus_client``): its counters and histograms, and ``exposition``, the
text a plug-in serves as ``GET /metrics``.

Each Backend has its own ``CollectorRegistry``. Request outcomes and engine latencies are observed once per
request, never per token or step; a plug-in adds its own series to the registry (``Metrics.own``). What users
wait for is timed by a request's clock (``RequestClock``, ``measured``) from the moment the UI says its request
arrived. The metrics: docs/api.md, "Metrics".
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, aclosing, contextmanager
from functools import wraps

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .errors import (
    BusyError,
    CancelledError,
    EngineUnavailableError,
    InvalidRequestError,
    ShapeFailedError,
    ShapeNotReadyError,
    ShowcaseError,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no *_created series: start times of each label set are noise on a dashboard
OUTCOMES = ("ok", "cancelled", "rejected", "error")  # rejected: a ShowcaseError the user can fix or retry
# Seconds: the tiny CPU models take milliseconds, a cold Neuron prefill seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
IMAGE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
# What a user waits for: a queue of 16 users in front of a Neuron image is minutes.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
IMAGE_STEPS_PER_S_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200)
# The endpoints a user waits on: the public API and the two tabs (their events are private); a plug-in adds its own.
WEB_ENDPOINTS = ("/chat", "/generate_image", "chat_tab", "image_tab")
QUEUE = "queue"  # a join that Gradio's queue (or the guard in front of it) refused: no handler ran
REFUSAL_REASONS = ("bad_input", "busy", "not_ready", "failed_shape", "auth", "other")


class Metrics:
    """The counters and histograms a Backend updates, and the series plug-ins add (``own``).

    Thread-safe: prometheus_client metrics take their own locks; ``queue_depth`` is a plain callable
    the UI sets (the requests waiting in Gradio's queue), read by plug-ins (a scrape, an admission).
    """

    def __init__(self):
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
        self.latency = Histogram("showcase_request_duration_seconds", "End to end, per endpoint: joined Gradio's "
                                 "queue (/v1: the request arrived) to its last update or byte; refusals included",
                                 ["endpoint"], buckets=WAIT_BUCKETS, registry=r)
        self.queue_wait = Histogram("showcase_queue_wait_seconds", "Joined Gradio's queue to the handler's start, "
                                    "per endpoint", ["endpoint"], buckets=WAIT_BUCKETS, registry=r)
        self.refusals = Counter("showcase_refusals", "Requests refused, by endpoint (queue: refused when joining "
                                "Gradio's queue) and reason (" + ", ".join(REFUSAL_REASONS) + ")",
                                ["endpoint", "reason"], registry=r)
        self.image_steps_per_s = Histogram("showcase_image_steps_per_second", "Image: denoising steps done per "
                                           "second of the pipeline call (text encoding and decode included), per "
                                           "image and precompiled size", ["size"],
                                           buckets=IMAGE_STEPS_PER_S_BUCKETS, registry=r)
        for endpoint in ("chat", "image"):  # export zeros before the first request
            self.in_progress.labels(endpoint)
            for outcome in OUTCOMES:
                self.requests.labels(endpoint, outcome)
        for endpoint in WEB_ENDPOINTS:
            self.latency.labels(endpoint)
        for endpoint in WEB_ENDPOINTS:
            self.queue_wait.labels(endpoint)
        self.queue_depth: Callable[[], int] | None = None
        self._owned: dict[str, object] = {}
        self._owning = threading.Lock()

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

    def observe_image(self, size: str, seconds: float, steps_done: int | None = None) -> None:
        self.image_seconds.labels(size).observe(seconds)
        if steps_done and seconds > 0:
            self.image_steps_per_s.labels(size).observe(steps_done / seconds)

    def observe_queue_wait(self, endpoint: str, seconds: float) -> None:
        self.queue_wait.labels(endpoint).observe(max(0.0, seconds))

    def observe_latency(self, endpoint: str, seconds: float) -> None:
        """One request's end-to-end time (see ``latency``)."""
        self.latency.labels(endpoint).observe(max(0.0, seconds))

    def refused(self, endpoint: str, reason: str) -> None:
        """One refusal; ``reason`` is one of REFUSAL_REASONS (anything else counts as "other")."""
        self.refusals.labels(endpoint, reason if reason in REFUSAL_REASONS else "other").inc()

    def own(self, key: str, make: Callable[[Metrics], object]):
        """A plug-in's own series on this registry: ``make(self)`` on the first call with ``key``, the same
        object after (a name registered twice in one registry is an error)."""
        with self._owning:
            if key not in self._owned:
                self._owned[key] = make(self)
            return self._owned[key]

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
            self.metrics.observe_image(str(result.params.get("size")), result.seconds, result.params.get("steps_done"))
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


def refusal_reason(exc: ShowcaseError) -> str | None:
    """The refusal label of a backend error a user was shown (None: a cancel, which is no refusal)."""
    if isinstance(exc, CancelledError):
        return None
    if isinstance(exc, InvalidRequestError):
        return "bad_input"
    if isinstance(exc, BusyError):
        return "busy"
    if isinstance(exc, ShapeFailedError):
        return "failed_shape"
    if isinstance(exc, (ShapeNotReadyError, EngineUnavailableError)):  # warming up, disabled or failed to load
        return "not_ready"
    return "other"


def join_refusal_reason(status: int) -> str | None:
    """The refusal label of a refused queue join's HTTP status (None: not refused)."""
    if status < 400:
        return None
    if status in (401, 403):
        return "auth"
    if status in (429, 503):  # 503: Gradio's "Queue is full"
        return "busy"
    return "bad_input" if status < 500 else "other"


class RequestClock:
    """One request's clock, from ``since`` (``time.monotonic()`` when the request arrived: for a web event, when
    it joined the queue); observes its queue wait when made (``waited`` false: a later event of a request whose
    wait was observed).

    ``finish`` observes the end-to-end time once (later calls do nothing); ``refused`` counts a refusal.
    """

    def __init__(self, metrics: Metrics, endpoint: str, since: float, waited: bool = True):
        self.metrics, self.endpoint, self.since = metrics, endpoint, since
        self._done = False
        if waited:
            metrics.observe_queue_wait(endpoint, time.monotonic() - self.since)

    def refused(self, exc: ShowcaseError) -> None:
        reason = refusal_reason(exc)
        if reason is not None:
            self.metrics.refused(self.endpoint, reason)

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self.metrics.observe_latency(self.endpoint, time.monotonic() - self.since)


def held_over(fn, around: Callable[[], AbstractContextManager]):
    """``fn`` (a generator or async generator function) with ``around()`` entered over each call's whole run:
    from its first step to its end or close."""
    if inspect.isasyncgenfunction(fn):

        @wraps(fn)
        async def async_gen_wrapper(*args, **kwargs):
            with around():
                async with aclosing(fn(*args, **kwargs)) as inner:
                    async for item in inner:
                        yield item

        return async_gen_wrapper

    @wraps(fn)
    def gen_wrapper(*args, **kwargs):
        with around():
            yield from fn(*args, **kwargs)

    return gen_wrapper


def measured(metrics: Metrics, endpoint: str, since: Callable[[], float], ends: bool = True):
    """A generator or async generator handler timed as one request of ``endpoint``: queue wait at its first line
    (``since()``: when its request arrived, read there), refusals (ShowcaseError, counted then re-raised for the
    error boundary outside it), and the end-to-end time when it ends (its generator ended or was closed). With
    ``ends`` false only a refusal ends the request here: a later event ends it with a ``RequestClock`` of its own.
    """

    @contextmanager
    def timed():
        clock = RequestClock(metrics, endpoint, since())
        try:
            yield
        except ShowcaseError as exc:
            clock.refused(exc)
            clock.finish()
            raise
        finally:
            if ends:
                clock.finish()

    return lambda fn: held_over(fn, timed)


def readiness(tasks: list) -> tuple[bool, dict]:
    """Whether every enabled engine serves every declared shape, and /readyz's small JSON body: what is still
    warming, what failed, and warnings (task names and fixed sentences only, never paths or errors). A bundle
    task that failed is a warning, never unreadiness; a failed or skipped engine task is not ready.
    """
    warming = [t.name for t in tasks if t.state in ("queued", "running")]
    ended_badly = [t for t in tasks if t.state in ("failed", "skipped")]
    failed = [t.name for t in ended_badly if t.kind != "bundle"]
    warnings = [f"{t.name}: {t.state}; the engines warm up without the bundle (details in /status)"
                for t in ended_badly if t.kind == "bundle"]
    ready = not warming and not failed
    return ready, {"ready": ready, "done": sum(t.state == "ready" for t in tasks), "total": len(tasks),
                   "warming": warming, "failed": failed, "warnings": warnings}


def shape_readiness(state: dict, engine_failed: bool = False) -> dict:
    """One shape's entry in /readyz's ``shapes`` (``state``, ``eta_s``), from its ``Backend.shape_states`` entry:
    "ready" (compiled, or eager after a failed Neuron compile), "queued" or "running" (``eta_s`` None when
    unknown), or "failed" (its compile failed or timed out, or ``engine_failed``); never the error text.
    """
    if engine_failed or state["state"] in ("failed", "skipped"):
        return {"state": "failed", "eta_s": None}
    if state["state"] == "ready":  # eta_until says None for it while a task still to run has no estimate
        return {"state": "ready", "eta_s": 0.0}
    eta = state["eta_s"]
    return {"state": state["state"], "eta_s": None if eta is None else round(eta, 1)}
