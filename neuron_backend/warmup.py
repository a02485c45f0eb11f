"""The warm-up plan, its background runner, and the status snapshot the UI renders.

Every task is listed at start-up (obtain weights, load, one task per static shape) and run in order on a
background thread while the app serves whatever is ready. Durations under the cache root give the next
start's ETA. The compile time limit and the first-run estimates: docs/trainium.md, "The first run".
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from .chat import static_cache
from .compilers import CompileWatch, kill_compilers
from .devices import CompileCounter, Placement, repeated_blocks
from .messages import Message, tr
from .shapes import EditSlot, ImageSize, ShapeKey, engine_name

log = logging.getLogger("showcase.warmup")

QUEUED, RUNNING, READY, FAILED, SKIPPED = "queued", "running", "ready", "failed", "skipped"
ENDED = (READY, FAILED, SKIPPED)

KIND_WORDS = {"weights": tr("weights"), "load": tr("load")}  # the task kinds an error names


def error_of(exc: BaseException, bare: bool = False) -> str:
    """"Kind: message" of an error (``bare``: the message alone), a Message when the error carries one."""
    said = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], Message) else str(exc)
    return said if bare else tr("{kind}: {error}", kind=type(exc).__name__, error=said)


def joined(key: str, parts: list) -> str:
    """``parts`` joined by the separator message ``key`` ("backend_join_dot": " · "), "" when there are none."""
    text = parts[0] if parts else ""
    for part in parts[1:]:
        text = tr(key, a=text, b=part)
    return text


def shape_title(key: ShapeKey, first: bool, batch: int = 1, chunk: int = 0) -> Message:
    """A warm-up task's title; ``chunk``: the compiled prefill chunk (0: eager prefill, chat/static_cache.py)."""
    if isinstance(key, ImageSize):
        return tr("size {size}", size=key.label)
    if isinstance(key, EditSlot):
        template = "size {size} + {n} reference" if key.references == 1 else "size {size} + {n} references"
        return tr(template, size=key.size.label, n=key.references)
    bucket = key.tokens
    title = tr("prompt bucket {bucket} tokens", bucket=bucket)
    title = tr("{title} × batch {batch}", title=title, batch=batch) if batch > 1 else title
    if chunk:
        template = "{title} in {n} compiled chunks of {chunk}" if bucket > chunk else \
            "{title} in {n} compiled chunk of {chunk}"
        title = tr(template, title=title, n=bucket // chunk, chunk=chunk)
    return tr("{title} + decode graphs", title=title) if first else title


@dataclass
class Task:
    """One step of the warm-up; plain data so the snapshot is JSON-serialisable."""

    name: str
    engine: str  # "chat" | "image"
    kind: str  # "weights" | "load" | "compile"
    shape: str | None = None  # compile tasks: the label of the shape key ("prefill-64", "1024x1024")
    state: str = QUEUED
    started_at: float | None = None  # wall-clock epoch seconds
    seconds: float | None = None  # elapsed while running, final once ended
    cache_hit: bool | None = None  # compile tasks: served from the persistent compile cache
    error: str | None = None
    expected_s: float | None = None  # from the timing history of earlier starts
    progress: float | None = None  # weights downloads: 0..1
    detail: str | None = None
    graphs: int | None = None  # compile tasks: graphs it compiles (chat_plan, image_plan)
    eager_programs: int | None = None  # compile tasks: eager modules the device compiles for this shape
    estimate_s: float | None = None  # compile tasks: the first-run estimate, for when no history is known
    # compile tasks while a neuronx-cc runs: {"run": its number in this task (1, 2, …), "seconds": how long it has
    # compiled, "idle_s": seconds since its CPU time last grew} (CompileWatch)
    compiling: dict | None = None
    # compile tasks, once ended: each neuronx-cc run seen, {"run", "seconds" (wall, to the second), "cpu_s"}
    compiler_runs: list | None = None


@dataclass
class Step:
    """A task and the callable that performs it; ``run(task)`` raises on failure."""

    task: Task
    run: Callable[[Task], None]
    history_key: str
    # past the compile time limit: told the task and the message it failed with (the Backend refuses its shape)
    on_timeout: Callable[[Task, str], None] | None = None


MAX_PLAUSIBLE_S = 24 * 3600.0  # a task "taking" longer than a day is a corrupt or hand-edited history entry
HIT_SUFFIX = "|cache-hit"  # compile tasks served from the persistent compile cache are timed apart
MIN_SLOW_S = 60.0  # a compile task is "still compiling" past twice its expected time, and never before this
MAX_STALL_S = 300.0  # a compiler run past the limit is ended after this long without progress (at most the limit)
WATCH_EVERY_S = 1.0  # how often a compile task's compiler runs are looked at (a quarter of a shorter limit)


def plausible_seconds(value: object) -> bool:
    """A duration worth learning from: a finite number from 0 to a day (not a bool, NaN, negative or huge)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0.0 <= value <= MAX_PLAUSIBLE_S)


class WarmupHook(Protocol):
    """What a plug-in adds to the warm-up: its ``Parts.hooks`` hold a factory per hook, called with the
    Backend once it is built."""

    def plan(self, steps: list[Step]) -> list[Step]:
        """The warm-up plan with this hook's steps in it (it may reorder the core's)."""

    def annotate(self, status: dict) -> dict:
        """``Backend.status()`` with what this hook adds to it."""

    def after(self, warmup: threading.Thread) -> None:
        """Called once the warm-up thread has started; must return at once."""


class TimingHistory:
    """Task durations of earlier starts, keyed by model, shape, device and software versions.

    A compile task is timed cold under ``key`` and as a compile-cache hit under ``key + HIT_SUFFIX`` (a warm
    restart takes a fraction of a cold start). Values ``plausible_seconds`` refuses are ignored.
    """

    def __init__(self, path: Path):
        self.path = path
        self._data: dict[str, float] = {}
        self.problem: str | None = None
        try:
            loaded = json.loads(path.read_text())
            if not isinstance(loaded, dict):
                raise TypeError(f"expected a JSON object, found {type(loaded).__name__}")
            self._data = {str(k): float(v) for k, v in loaded.items() if plausible_seconds(v)}
            if len(self._data) < len(loaded):
                log.warning("timing history %s: ignored %d implausible value(s)", path, len(loaded) - len(self._data))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError, TypeError, RecursionError) as exc:
            self.problem = f"timing history {path} unreadable ({exc}); starting afresh"
            log.warning(self.problem)

    @staticmethod
    def key(*parts: object) -> str:
        return "|".join(str(p) for p in parts)

    def get(self, key: str, cache_hit: bool = False) -> float | None:
        """The last duration of ``key``: cold by default, ``cache_hit=True`` for its compile-cache hit."""
        return self._data.get(key + HIT_SUFFIX if cache_hit else key)

    def record(self, key: str, seconds: float, cache_hit: bool | None = None) -> None:
        """Remember a duration (under the hit key when the compile cache served the task)."""
        if plausible_seconds(seconds):
            self._data[key + HIT_SUFFIX if cache_hit else key] = round(seconds, 3)

    def save(self) -> None:
        """Write atomically; a read-only cache root is logged, never raised."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._data, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError as exc:
            self.problem = f"timing history not saved ({exc})"
            log.warning(self.problem)


def versions_tag(versions: dict[str, str]) -> str:
    """A short hash of the software versions: a new torch or SDK invalidates old timings."""
    return hashlib.sha1(json.dumps(versions, sort_keys=True).encode(), usedforsecurity=False).hexdigest()[:10]


class WarmupRunner:
    """Runs the planned steps in order on one background thread.

    Thread-safety: ``snapshot()`` may be called from any thread while ``run()`` executes;
    both take ``self._lock`` around the task list.
    """

    def __init__(self, steps: list[Step], history: TimingHistory, compile_timeout_s: float | None = None):
        """``compile_timeout_s``: the time limit of one compile task (None: none)."""
        self._steps = steps
        self.compile_timeout_s = compile_timeout_s
        self._history = history
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self._graphs_at_ready: int | None = None
        self._disabled: dict[str, str] = {}  # engine -> reason its remaining tasks are skipped
        # task name -> its cold duration, for compile tasks that ran cold last time and so are
        # expected to hit the compile cache now, with no hit duration learned yet (see _expected)
        self._cold_only: dict[str, float] = {}
        for step in steps:
            hit, cold = history.get(step.history_key, cache_hit=True), history.get(step.history_key)
            step.task.expected_s = hit if hit is not None else cold
            if hit is None and cold is not None and step.task.kind == "compile":
                self._cold_only[step.task.name] = cold

    @property
    def tasks(self) -> list[Task]:
        return [s.task for s in self._steps]

    def start(self) -> threading.Thread:
        """Run in the background; return the thread."""
        self._thread = threading.Thread(target=self.run, name="warmup", daemon=True)
        self._thread.start()
        return self._thread

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every task ended; return whether it did."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    @property
    def ready(self) -> bool:
        return self.ready_at is not None

    def run(self) -> None:
        """Run every step; a failure is recorded and the rest continue."""
        self.started_at = time.time()
        for step in self._steps:
            task = step.task
            reason = self._disabled.get(task.engine)
            if reason is not None:
                self._end(task, SKIPPED, error=reason)
                continue
            self._run_step(step)
        self._history.save()
        with self._lock:
            self._graphs_at_ready = CompileCounter.graphs()
            self.ready_at = time.time()
        log.info("warm-up finished in %.1f s", self.ready_at - self.started_at)

    def _run_step(self, step: Step) -> None:
        task = step.task
        with self._lock:
            task.state, task.started_at = RUNNING, time.time()
        expected = f" (expected {task.expected_s:.1f} s)" if task.expected_s is not None else ""
        log.info("warm-up start: %s%s", task.name, expected)
        hits_before, graphs_before, loaded_before = CompileCounter.cache_hits(), CompileCounter.graphs(), \
            CompileCounter.loaded()
        t0 = time.perf_counter()
        try:
            if not self._run_within_limit(step):
                return
        except Exception as exc:  # noqa: BLE001 - isolated: recorded, shown, the rest continue
            message = error_of(exc)
            self._end(task, FAILED, seconds=time.perf_counter() - t0, error=message)
            log.error("warm-up FAILED: %s after %.1f s: %s", task.name, task.seconds, message)
            if task.kind in ("weights", "load"):
                self._disabled[task.engine] = tr("{engine} engine unavailable: {kind} failed ({error})",
                                                 engine=engine_name(task.engine),
                                                  kind=KIND_WORDS[task.kind], error=message)
            return
        seconds = time.perf_counter() - t0
        cache_hit = None
        if task.kind == "compile" and CompileCounter.graphs() > graphs_before:
            hits, misses = (a - b for a, b in zip(CompileCounter.cache_hits(), hits_before, strict=True))
            cache_hit = hits > 0 and misses == 0
        elif task.kind == "compile" and CompileCounter.loaded() > loaded_before:  # saved whole, loaded (Parts.compiled)
            cache_hit = True
        self._end(task, READY, seconds=seconds, cache_hit=cache_hit)
        self._history.record(step.history_key, seconds, cache_hit)
        log.info("warm-up done: %s in %.1f s%s", task.name, seconds, " (compile cache hit)" if cache_hit else "")

    def _run_within_limit(self, step: Step) -> bool:
        """Run the step on a thread of its own; False when a compile task ran past its time limit (then it is
        failed, saying what to do, and every ``neuronx-cc`` this process started is killed). The limit is per
        graph; a ``neuronx-cc`` run is ended only after ``stall_s`` without progress (docs/trainium.md,
        "The first run")."""
        limit, task = self.compile_timeout_s, step.task
        if task.kind != "compile" or not limit:
            step.run(task)
            return True
        outcome: list[BaseException | None] = []

        def work() -> None:
            try:
                step.run(task)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the warm-up thread below
                outcome.append(exc)

        graphs, stall_s = max(1, task.graphs or 0), min(limit, MAX_STALL_S)
        watch, began = CompileWatch(), time.time()
        worker = threading.Thread(target=work, name=f"warmup-{task.engine}", daemon=True)
        worker.start()
        message, quiet_s, looked = None, 0.0, began  # quiet_s: seconds with no compiler running
        while message is None:
            worker.join(min(WATCH_EVERY_S, limit / 4))
            if outcome:
                break
            now = time.time()
            running = watch.poll(now)
            quiet_s, looked = quiet_s + (0.0 if running else now - looked), now
            with self._lock:
                task.compiling = running[0].state(now) if running else None
            stuck = [run for run in running if now - run.started > limit and now - run.progressed >= stall_s]
            if stuck:
                message = tr("still compiling: neuronx-cc run {run} of this task made no progress for {idle} s after "
                             "{minutes} min, past the time limit of one graph (--compile-timeout-min); this shape "
                             "is refused until a restart. Restart with a higher --compile-timeout-min (its graphs "
                             "that did compile come from the compile cache), or drop this shape from the settings.",
                             run=stuck[0].number, idle=f"{now - stuck[0].progressed:.0f}",
                             minutes=f"{(now - stuck[0].started) / 60:.3g}")
            elif not running and quiet_s > limit * graphs:
                message = tr("still compiling after {minutes} min, the time limit of its {graphs} graph(s) "
                             "(--compile-timeout-min per graph); this shape is refused until a restart. Restart "
                             "with a higher --compile-timeout-min (its graphs that did compile come from the "
                             "compile cache), or drop this shape from the settings.",
                             minutes=f"{quiet_s / 60:.3g}", graphs=graphs)
        watch.poll(time.time())  # the runs that ended since the last look
        with self._lock:
            task.compiling, task.compiler_runs = None, watch.summary()
        if outcome:
            if outcome[0] is not None:
                raise outcome[0]
            return True
        kill_compilers()  # a stuck neuronx-cc: killed, its compile fails and the task's thread ends
        seconds = time.time() - began
        self._end(task, FAILED, seconds=seconds, error=message)
        log.error("warm-up FAILED: %s past the compile time limit after %.0f s; it goes on in the background, "
                  "unused: %s", task.name, seconds, message)
        if step.on_timeout is not None:
            step.on_timeout(task, message)
        return False

    def _end(self, task: Task, state: str, seconds: float | None = None, error: str | None = None,
             cache_hit: bool | None = None) -> None:
        with self._lock:
            task.state, task.seconds, task.error, task.cache_hit = state, seconds, error, cache_hit

    def compiles_since_ready(self) -> int:
        """Graph compiles after warm-up ended: the recompile alarm (should stay 0)."""
        with self._lock:
            at_ready = self._graphs_at_ready
        return 0 if at_ready is None else CompileCounter.graphs() - at_ready

    def eta_until(self, engine: str, shape: str, planned: bool = False) -> float | None:
        """Seconds until the task of shape label ``shape`` is expected to end (None when unknown).

        ``planned``: where nothing is learned, a compile task counts its first-run estimate (chat_plan, image_plan)
        and any other task 0, as ``plan()`` does: a hint from the first moment (a client's Retry-After).
        """
        remaining = self._remaining_estimates(planned)
        total = 0.0
        for task, estimate in remaining:
            if estimate is None:
                return None
            total += estimate
            if task.engine == engine and task.shape == shape:
                return total
        return 0.0

    def slow_after(self, task: dict) -> float | None:
        """Seconds after which a running compile task reads "still compiling" (None: not a compile task).

        Twice its expected time (learned, else the first-run estimate), at least MIN_SLOW_S, at most half the
        time limit."""
        if task["kind"] != "compile":
            return None
        known = task["expected_s"] if task["expected_s"] is not None else task["estimate_s"]
        after = max(2 * known, MIN_SLOW_S) if known is not None else None
        if self.compile_timeout_s:
            after = self.compile_timeout_s / 2 if after is None else min(after, self.compile_timeout_s / 2)
        return after

    def plan(self, tasks: list[dict]) -> dict:
        """What the warm-up compiles, per engine, and the time left by the first-run estimate.

        ``eta_s``: per unfinished task its learned time if known, else its estimate (0 for a task with
        neither: a download or a load on a first start), less what a running task has spent."""
        engines: dict[str, dict] = {}
        for t in tasks:
            if t["kind"] == "compile":
                e = engines.setdefault(t["engine"], {"graphs": 0, "eager_programs": 0, "estimate_s": 0.0})
                e["graphs"] += t["graphs"] or 0
                e["eager_programs"] += t["eager_programs"] or 0
                e["estimate_s"] += t["estimate_s"] or 0.0
        left = 0.0
        for t in tasks:
            if t["state"] in ENDED:
                continue
            known = t["expected_s"] if t["expected_s"] is not None else t["estimate_s"] or 0.0
            left += max(0.0, known - (t["seconds"] or 0.0)) if t["state"] == RUNNING else known
        return {"engines": engines, "graphs": sum(e["graphs"] for e in engines.values()),
                "eager_programs": sum(e["eager_programs"] for e in engines.values()),
                "eta_s": 0.0 if self.ready else round(left, 1),
                "learned": all(t["expected_s"] is not None for t in tasks),
                "compile_timeout_s": self.compile_timeout_s}

    def _remaining_estimates(self, planned: bool = False) -> list[tuple[Task, float | None]]:
        """Each unfinished task with its expected remaining seconds (``planned``: see ``eta_until``)."""
        now = time.time()
        with self._lock:
            tasks = [asdict(t) for t in self.tasks]
            known = {}
            for t in tasks:  # this run's durations of the same engine and kind fill gaps in the history
                if t["state"] == READY and t["seconds"] is not None:
                    known.setdefault((t["engine"], t["kind"]), t["seconds"])
        hit_ratio = self._hit_ratio(tasks)
        out = []
        for t in tasks:
            if t["state"] in ENDED:
                continue
            expected = t["expected_s"] if t["expected_s"] is not None else known.get((t["engine"], t["kind"]))
            if t["name"] in self._cold_only and hit_ratio is not None:
                expected = self._cold_only[t["name"]] * hit_ratio
            if expected is None and planned:
                expected = t["estimate_s"] or 0.0
            if expected is not None and t["state"] == RUNNING and t["started_at"]:
                expected = max(0.0, expected - (now - t["started_at"]))
            out.append((Task(**t), expected))
        return out

    def _hit_ratio(self, tasks: list[dict]) -> float | None:
        """Cache-hit over cold duration, from this run's compile tasks that hit after a cold last run."""
        ratios = [t["seconds"] / self._cold_only[t["name"]] for t in tasks
                  if t["state"] == READY and t["cache_hit"] and t["name"] in self._cold_only
                  and t["seconds"] is not None and self._cold_only[t["name"]] > 0]
        return sum(ratios) / len(ratios) if ratios else None

    def snapshot(self) -> dict:
        """Plain-data status for the UI (JSON-serialisable)."""
        now = time.time()
        with self._lock:
            tasks = [asdict(t) for t in self.tasks]
        for t in tasks:
            if t["state"] == RUNNING and t["started_at"]:
                t["seconds"] = round(now - t["started_at"], 2)
            slow = self.slow_after(t) if t["state"] == RUNNING else None
            t["still_compiling"] = slow is not None and (t["seconds"] or 0.0) >= slow
        done = sum(t["state"] in ENDED for t in tasks)
        estimates = [e for _, e in self._remaining_estimates()]
        eta = None if any(e is None for e in estimates) else round(sum(estimates), 1)
        return {
            "tasks": tasks,
            "done": done,
            "total": len(tasks),
            "progress": done / len(tasks) if tasks else 1.0,
            "eta_s": 0.0 if self.ready else eta,
            "ready": self.ready,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "elapsed_s": round((self.ready_at or now) - self.started_at, 2) if self.started_at else 0.0,
            "failed": [t["name"] for t in tasks if t["state"] == FAILED],
            "cache_hits": sum(bool(t["cache_hit"]) for t in tasks),
            "compiles_since_ready": self.compiles_since_ready(),
            "plan": self.plan(tasks),
        }

# ----- the first-run compile plan ---------------------------------------------------------------------------
# Before anything compiles the warm-up knows what each task builds: per chat bucket its new prefill-chunk
# graphs (the first bucket also the decode graph of every cache window), per image size or edit slot the
# transformer's graphs, and the eager programs a device compiles for the rest. Count times a per-graph estimate
# is a task's first-run ETA, until TimingHistory has learned its time here. The seconds are estimates set on
# the high side, not measurements (docs/trainium.md, "The first run: what is compiled and how long").
# Estimated seconds per compiled graph or eager program on a first run (empty compile cache), by device
# family and what is compiled. Neuron: neuronx-cc on one trn2 core; elsewhere: inductor on the host.
SECONDS_PER_GRAPH = {
    ("neuron", "chat"): 600.0,  # a whole-model Qwen3-0.6B graph (28 layers, one static KV cache)
    ("neuron", "image"): 2400.0,  # a whole FLUX.2-klein-4B transformer graph (5 double + 20 single blocks)
    ("neuron", "image-block"): 600.0,  # one repeated transformer block class (--compile-repeated-blocks)
    ("neuron", "eager"): 300.0,  # one module run eager: its ops compiled for one input shape
    ("other", "chat"): 60.0,
    ("other", "image"): 120.0,
    ("other", "image-block"): 60.0,
    ("other", "eager"): 0.0,  # eager on CPU or CUDA compiles nothing
}
FLUX2_BLOCK_CLASSES = 2  # the double-stream and the single-stream block: one graph each per shape


@dataclass(frozen=True)
class TaskPlan:
    """What one compile task of the warm-up builds, and its first-run estimate in seconds."""

    graphs: int  # compiled graphs (torch.compile)
    eager_programs: int  # modules run eager whose ops the device compiles for this shape (Neuron only)
    estimate_s: float


def family(placement: Placement) -> str:
    """"neuron" or "other": which column of SECONDS_PER_GRAPH a placement reads."""
    return "neuron" if placement.kind == "neuron" else "other"


def chat_plan(settings, placement: Placement, buckets: list[int], index: int) -> TaskPlan:
    """The graphs the warm-up of ``buckets[index]`` compiles that no earlier bucket compiled.

    The first bucket also compiles the decode graph of every cache window a reply may reach
    (chat/engine.py's warm-up); each bucket adds the prefill-chunk graphs earlier buckets lack.
    """
    windows = static_cache.declared(settings.cache_windows, settings.context_length)
    chunk = static_cache.chunk_size(settings, placement.compile)
    bucket = buckets[index]
    eager = int(placement.kind == "neuron" and not chunk)  # the prefill (with compile off: all) runs eager
    graphs = 0
    if placement.compile:
        earlier = {g for b in buckets[:index] for g in static_cache.prefill_graphs(b, chunk, windows)}
        graphs = len(static_cache.prefill_graphs(bucket, chunk, windows) - earlier)
        graphs += len(static_cache.decode_graphs(bucket, windows)) if index == 0 else 0
    return _priced(placement, "chat", graphs, eager)


def image_plan(settings, placement: Placement, shape: ShapeKey, index: int) -> TaskPlan:
    """The transformer's graphs at this size or edit slot, and the eager programs around it (listed in
    docs/trainium.md, "The first run")."""
    blocks = repeated_blocks(settings, placement)  # on by default where the image engine compiles on neuron
    graphs = (FLUX2_BLOCK_CLASSES if blocks else 1) if placement.compile else 0
    eager = 0
    if placement.kind == "neuron":
        eager = 1 + (index == 0) + isinstance(shape, EditSlot) + (not placement.compile or blocks)
    return _priced(placement, "image-block" if blocks else "image", graphs, eager)


def _priced(placement: Placement, kind: str, graphs: int, eager: int) -> TaskPlan:
    side = family(placement)
    seconds = graphs * SECONDS_PER_GRAPH[side, kind] + eager * SECONDS_PER_GRAPH[side, "eager"]
    return TaskPlan(graphs, eager, seconds)
