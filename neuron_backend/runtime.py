"""The backend as the app sees it: settings in, engines, warm-up and status out.

Start-up is cheap (no model import or load happens here): the warm-up thread creates and loads
the engines, so the UI can be served at once and show the progress.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from . import devices, warmup
from .chat import static_cache
from .errors import ConfigError, EngineUnavailableError, InvalidRequestError, ShapeNotReadyError
from .exports import EXPORTS_DIR_NAME, ExportFolder
from .image import loading
from .messages import tr
from .metrics import Metrics, readiness, shape_readiness
from .plugins import ChatBatch, Parts, Sharding
from .settings import Settings
from .shapes import ShapeKey, engine_name, shape_keys
from .warmup import (
    Step,
    Task,
    TimingHistory,
    WarmupHook,
    WarmupRunner,
    error_of,
    joined,
    shape_title,
    versions_tag,
)
from .weights import file_on_disk, model_ref, snapshot_revision

log = logging.getLogger("showcase")

ENGINES = ("chat", "image")


def model_folder(settings: Settings, engine: str, demo_models: Callable[[Settings, str], Path] | None,
                 progress=None) -> Path:
    """A local folder with the engine's model: its demo model, from ``demo_models`` (a plug-in's builder,
    ``Parts.demo_models``; none: the demo models are refused), or the real one."""
    if settings.demo:
        if demo_models is None:
            raise ConfigError("--models", tr("tiny needs a plug-in that builds the demo models, and none is "
                                             "installed: list one in app.py's PLUGINS, or pass --models full"))
        return demo_models(settings, engine)
    from .weights import obtain

    # A download that receives nothing for this long is abandoned with what to do (weights.py).
    stall = max(30.0, 6 * settings.hub_timeout)
    model, revision = asked_model(settings, engine)
    return obtain(model, progress, engine, hub_timeout=settings.hub_timeout, stall_timeout=stall,
                  flag=f"--{engine}-model", revision=revision)


def asked_model(settings: Settings, engine: str) -> tuple[str, str | None]:
    """(hub id or folder, revision or None) that ``--chat-model``/``--image-model`` asked for."""
    if engine == "chat":
        return settings.chat_model, settings.chat_revision
    return settings.image_model, settings.image_revision


def create_engine(settings: Settings, name: str, placement: devices.Placement, model_id: str, compiled: tuple = (),
                  chat_batch: ChatBatch | None = None, sharding: Sharding | None = None):
    """A new, unloaded engine of kind ``name`` (imported here: the engines pull in transformers/diffusers);
    ``compiled``: the plug-ins' wrappers of its compiled forward (``Parts.compiled``); ``chat_batch``: the chat's
    (``Parts.chat_batch``); ``sharding``: loads a shard where ``placement.tp`` is above 1 (``Parts.sharding``)."""
    if name == "chat":
        from .chat.engine import ChatEngine

        return ChatEngine(settings, placement, model_id, compiled, chat_batch, sharding)
    from .image.engine import ImageEngine

    return ImageEngine(settings, placement, model_id, compiled, sharding)


class Backend:
    """Owns the engines and their warm-up. Safe to call from many request threads."""

    def __init__(self, settings: Settings, host: devices.HostDevices | None = None, parts: Parts = Parts()):
        """``parts``: what the plug-ins add here (plugins.py): warm-up hooks, engines run elsewhere, wrappers of
        the engines' compiled forwards, the chat's batch, the sharded engine, the builder of the demo models."""
        self.settings = settings
        self.cache = devices.configure_compile_cache(settings.cache_dir)
        if self.cache.problem:
            log.warning(self.cache.problem)
        for note in self.cache.notes:
            log.info(note)
        log.info("compile caches: %s", ", ".join(f"{name}={path}" for name, path in self.cache.paths))
        self.host = devices.detect() if host is None else host
        self.placements = devices.resolve_placements(settings, self.host, parts.elsewhere, parts.sharding)
        devices.refuse_idle_compile_flags(settings, self.placements)  # --compile-repeated-blocks without compile
        self.description = devices.describe(self.placements, self.host)
        if parts.elsewhere and parts.remote is None:
            raise ValueError(f"parts place {sorted(parts.elsewhere)} elsewhere but give no remote to connect them")
        self._remote = parts.remote(settings) if parts.elsewhere else None
        # handed to the engines it creates
        self._compiled, self._chat_batch, self._sharding = parts.compiled, parts.chat_batch, parts.sharding
        self._demo_models = parts.demo_models  # builds an engine's demo model folder (--models tiny, auto's fallback)
        self.chat_rows = parts.chat_rows  # the rows of every compiled chat shape
        self.description["allocator"] = devices.limit_malloc_arenas(self.placements)
        self._engines: dict[str, object] = {}
        self._folders: dict[str, Path] = {}
        self.fallbacks: dict[str, str] = {}  # engine -> why its real model gave way to the demo (--models auto)
        self._lock = threading.Lock()
        history = TimingHistory(settings.cache_dir / "warmup-history.json")
        self.hooks: list[WarmupHook] = [make(self) for make in parts.hooks]
        steps = self._plan()
        for hook in self.hooks:
            steps = hook.plan(steps)
        self.runner = WarmupRunner(steps, history, settings.compile_timeout_min * 60 or None)  # 0: no limit
        self.exports = ExportFolder(settings.cache_dir / EXPORTS_DIR_NAME)  # conversation/QA exports, unsaved PNGs
        self.metrics = Metrics()

    def served_folders(self) -> list[Path]:
        """The only folders whose files the page hands out (launch's allowed_paths): images and exports.

        The outputs folder is the one ``image/engine.py`` saves into.
        """
        return [self.settings.cache_dir / "outputs", self.exports.folder]

    # ----- what runs where -------------------------------------------------------------------
    def model_id(self, engine: str, with_revision: bool = True) -> str:
        """What the engine runs: a hub id with its ``revision`` (``org/name@<commit sha>``), a local folder,
        or the demo model."""
        if self.remote(engine):  # what the server says it runs, once connected
            there = self._engines.get(engine)
            if there is None or not there.demo:
                return there.model if there is not None and there.model else asked_model(self.settings, engine)[0]
        if self.remote(engine) or self.settings.demo or engine in self.fallbacks:
            return tr("demo {family} (tiny, random weights)", family="Qwen3" if engine == "chat" else "FLUX.2-klein")
        model = asked_model(self.settings, engine)[0]
        return model_ref(model, self.revision(engine)) if with_revision else model

    def chat_slots(self) -> int:
        """How many chat replies stream at once: the chat's rows here; with --chat-server up to --queue-size (the
        server batches them, vLLM continuously, and answers 429 when full)."""
        return self.settings.queue_size if self.remote("chat") else self.chat_rows

    def image_slots(self) -> int:
        """How many image requests run at once: one per --image-server worker, else one (the engine's own line)."""
        return len(self.placements["image"].device.split(",")) if self.remote("image") else 1

    def runs_demo(self, engine: str) -> bool:
        """Whether ``engine`` runs a demo model by choice: here (--models tiny), or on its servers, as they say."""
        if self.remote(engine):
            there = self._engines.get(engine)
            return bool(there is not None and there.demo)
        return self.settings.demo

    def remote(self, engine: str) -> bool:
        """Whether ``engine`` runs on other servers (--chat-server, --image-server), not in this process."""
        placement = self.placements.get(engine)
        return placement is not None and placement.kind == "remote"

    def revision(self, engine: str) -> str | None:
        """The commit sha of the cached snapshot the engine's weights came from, once obtained; until then the
        revision asked for. None for main before the weights are found, a local folder or the demo model."""
        if self.settings.demo or engine in self.fallbacks or self.remote(engine):
            return None
        return snapshot_revision(self._folders.get(engine)) or asked_model(self.settings, engine)[1]

    def banner(self) -> str:
        """One line that says plainly what runs where (a message: the page shows it in its language)."""
        parts = [tr("{engine}: {model} on {placement}",
                    engine=engine_name(name), model=self.model_id(name), placement=p.label())
                 for name, p in self.placements.items()]
        tail = [tr("demo models with random weights: output is noise")] if self.settings.demo else []
        tail += [tr("{engine} FELL BACK to its demo model (random weights): {reason}",
                    engine=engine_name(name), reason=reason)
                 for name, reason in self.fallbacks.items()]
        return joined("{a} · {b}", [self.description["accelerator"], joined("{a} | {b}", parts), *tail])

    def log_startup(self) -> None:
        log.info("device: %s", self.description["accelerator"])
        if self.description["allocator"]:
            log.info("host %s", self.description["allocator"])
        if self.host.neuron_problem:
            log.warning("Neuron: %s", self.host.neuron_problem)
        for name, p in self.placements.items():
            log.info("%s engine: %s on %s", name, self.model_id(name), p.label())
        level = logging.WARNING if self.settings.demo else logging.INFO
        log.log(level, "models: %s (%s)", self.settings.models, self.settings.models_reason)
        log.info("cache root: %s", self.settings.cache_dir)

    # ----- warm-up -----------------------------------------------------------------------------
    def _plan(self) -> list[Step]:
        """Weights, load and first shape of each engine in order, then the remaining shapes."""
        tag = versions_tag(self.description["versions"])
        head, tail = [], []
        for engine in self.settings.warmup_order:
            if engine not in self.placements:
                continue
            p = self.placements[engine]

            def key(kind, shape=None, engine=engine, p=p):
                return TimingHistory.key(engine, self.model_id(engine), kind, shape, p.device, p.dtype_name,
                                         p.compile, devices.repeated_blocks(self.settings, p), tag)

            said = engine_name(engine)
            if p.kind == "remote":  # per server, one task: reach it and wait until it serves (RemoteEngines)
                head += [Step(Task(tr("{engine} · connect to {url}", engine=said, url=url), engine, "load"),
                              functools.partial(self._connect, url), key("load")) for url in p.device.split(",")]
                continue
            head.append(Step(Task(tr("{engine} · obtain weights", engine=said), engine, "weights"), self._obtain,
                             key("weights")))
            head.append(Step(Task(tr("{engine} · load on {device}",
                                     engine=said, device=p.device), engine, "load"), self._load,
                             key("load")))
            batch = self.chat_rows if engine == "chat" else 1
            chunk = static_cache.chunk_size(self.settings, p.compile) if engine == "chat" else 0
            shapes = shape_keys(self.settings, engine)
            for i, shape in enumerate(shapes):
                title = shape_title(shape, i == 0, batch, chunk)
                planned = warmup.chat_plan(self.settings, p, [s.tokens for s in shapes], i) \
                    if engine == "chat" else warmup.image_plan(self.settings, p, shape, i)
                task = Task(tr("{engine} · {title}", engine=said, title=title), engine, "compile", shape.label,
                            graphs=planned.graphs, eager_programs=planned.eager_programs,
                            estimate_s=planned.estimate_s)
                timed = shape.label if batch == 1 else f"{shape.label}@batch{batch}"  # batch N warms up other graphs
                timed += f"@chunk{chunk}" if chunk else ""  # compiled prefill chunks: other graphs, other times
                run = functools.partial(self._warm_up, shape)  # the task carries the label, the step the key
                refuse = functools.partial(self._refuse_shape, shape)
                (head if i == 0 else tail).append(Step(task, run, key("compile", timed), refuse))
        return head + tail

    def start(self) -> threading.Thread:
        """Start the background warm-up (the hooks hear of it: the bundle hook records the cache at its end)."""
        thread = self.runner.start()
        for hook in self.hooks:
            hook.after(thread)
        return thread

    def _obtain(self, task: Task) -> None:
        def progress(fraction: float, text: str) -> None:
            task.progress, task.detail = fraction, text

        try:
            self._folders[task.engine] = model_folder(self.settings, task.engine, self._demo_models, progress)
        except Exception as exc:  # noqa: BLE001 - --models auto falls back; otherwise re-raised
            self._fall_back(task.engine, exc)
        task.detail = str(self._folders[task.engine])

    def _load(self, task: Task) -> None:
        try:
            engine = self._create(task.engine)
            engine.load(self._folders[task.engine])
        except Exception as exc:  # noqa: BLE001 - as in _obtain
            if task.engine in self.fallbacks:
                raise
            self._fall_back(task.engine, exc)
            engine = self._create(task.engine)
            engine.load(self._folders[task.engine])
        fell = tr("demo model instead: {reason}", reason=self.fallbacks[task.engine]) if task.engine in self.fallbacks \
            else None
        task.detail = getattr(engine, "memory_note", None) or fell or task.detail
        with self._lock:
            self._engines[task.engine] = engine

    def _connect(self, url: str, task: Task) -> None:
        """Reach the server at ``url`` and wait until it serves; its engine serves from the first one reached."""
        engine = self._remote.connect(task.engine, url, task)
        with self._lock:
            self._engines[task.engine] = engine

    def _fall_back(self, name: str, exc: Exception) -> None:
        """--models auto: switch ``name`` to its demo model, loudly; else re-raise (full: that engine fails)."""
        if (self.settings.models_requested != "auto" or self.settings.demo or name in self.fallbacks
                or self.placements[name].tp > 1):
            raise exc
        reason = error_of(exc)
        log.error("%s engine: the real model failed (%s); falling back to the demo model", name, reason)
        # recorded once the demo folder exists: a fallback that could not be built is that engine's failure
        self._folders[name] = model_folder(self.settings.replace(models="tiny"), name, self._demo_models)
        self.fallbacks[name] = reason

    def _create(self, name: str):
        placement = self.placements[name]
        engine = create_engine(self.settings, name, placement, self.model_id(name), self._compiled, self._chat_batch,
                               self._sharding)
        if placement.tp > 1:  # rank 0 of a tensor-parallel group: followers mirror every generation
            self._sharding.attach(name, engine)
        engine.shapes.gated = True  # from now on only warmed-up shapes serve requests
        return engine

    def _warm_up(self, shape: ShapeKey, task: Task) -> None:
        engine = self.engine(task.engine)
        saved = getattr(engine, "saved_forwards", None)  # a wrapper's handle (Parts.compiled): saves it refused
        refused_before = saved.refused_saves if saved is not None else 0
        engine.warm_up(shape)
        if task.state == "failed":  # it ran past the compile time limit: its shape stays refused
            engine.shapes.mark_failed(shape, task.error)
            return
        notes = []
        if why := engine.shapes.eager.get(shape):  # Neuron: its compile failed, so it serves eager
            notes.append(tr("eager fallback: {why}", why=why))
        if saved is not None and saved.refused_saves and not refused_before:  # said once, on the first refusal
            notes.append(tr("compiled, but not saved for the next start ({n} so far): {why}", n=saved.refused_saves,
                            why=next(iter(saved.save_errors.values()))))
        if notes:
            task.detail = joined("{a} · {b}", notes)

    def _refuse_shape(self, shape: ShapeKey, task: Task, message: str) -> None:
        """A compile task ran past the time limit: requests for its shape are refused with ``message``."""
        self.engine(task.engine).shapes.mark_failed(shape, message)

    # ----- serving ------------------------------------------------------------------------------
    def engine(self, name: str):
        """The loaded engine, or EngineUnavailableError saying why not (disabled, loading, failed)."""
        with self._lock:
            engine = self._engines.get(name)
        if engine is not None:
            return engine
        if name not in self.placements:
            raise EngineUnavailableError(tr("The {engine} engine is disabled on this server ({flag}).",
                                            engine=engine_name(name), flag=f"--no-{name}"))
        for task in self.runner.tasks:
            if task.engine == name and task.kind in ("weights", "load") and task.state in ("failed", "skipped"):
                raise EngineUnavailableError(tr("The {engine} engine failed to load: {error}",
                                                engine=engine_name(name), error=task.error))
        eta = self.runner.eta_until(name, shape_keys(self.settings, name)[0].label)
        # a task past its expected time leaves nothing to wait by the estimate: not "about 0 s"
        when = ("" if eta is None else tr(" (expected any moment now)") if eta < 0.5
                else tr(" (expected in about {eta} s)", eta=f"{eta:.0f}"))
        raise EngineUnavailableError(tr("The {engine} engine is still loading{when}; try again shortly.",
                                        engine=engine_name(name), when=when))

    def explain_not_ready(self, engine: str, exc: ShapeNotReadyError) -> ShapeNotReadyError:
        """The same error with the expected time until that shape is ready."""
        eta = self.runner.eta_until(engine, exc.shape)
        if eta is None:
            return exc
        if eta < 0.5:  # the shape's task is past its expected time
            return ShapeNotReadyError(tr("{error} It should be ready any moment now.",
                                         error=error_of(exc, bare=True)), exc.shape)
        return ShapeNotReadyError(tr("{error} It should be ready in about {eta} s.",
                                     error=error_of(exc, bare=True), eta=f"{eta:.0f}"), exc.shape)

    def stream_chat(self, request, stop: threading.Event | None = None) -> Iterator:
        """Stream a chat reply (see ChatEngine.stream); counted once in the metrics with its outcome."""
        with self.metrics.track("chat") as tracked:
            engine = self.engine("chat")
            try:
                yield from tracked.chat(engine.stream(request, stop))
            except ShapeNotReadyError as exc:
                raise self.explain_not_ready("chat", exc) from None

    def generate_image(self, request, progress: Callable[[int, int, float], None] | None = None,
                       cancel: threading.Event | None = None):
        """Generate one image (``request.count`` must be 1): ``generate_images``' only one."""
        if getattr(request, "count", 1) != 1:
            raise InvalidRequestError(f"generate_image() makes one image; use generate_images() for {request.count}.")
        return self.generate_images(request, progress, cancel)[0]

    def generate_images(self, request, progress: Callable[[int, int, float], None] | None = None,
                        cancel: threading.Event | None = None, preview: Callable | None = None) -> list:
        """Generate ``request.count`` images (see ImageEngine.generate_run); one request in the metrics."""
        with self.metrics.track("image") as tracked:
            engine = self.engine("image")
            try:
                results = engine.generate_run(request, progress, cancel, preview)
            except ShapeNotReadyError as exc:
                raise self.explain_not_ready("image", exc) from None
            return tracked.images(results)

    def start_image(self, request, preview: bool = False) -> ImageCall:
        """Generate ``request.count`` images on a worker thread so the caller can poll progress and
        preview frames (``preview``: keep the latest one) and cancel it."""
        return ImageCall(self, request, preview)

    def image_distilled(self) -> bool:
        """Whether the image model ignores guidance: the loaded model's answer; before it loads, its
        model_index.json's where the checkpoint is on disk; else True (FLUX.2-klein is distilled)."""
        engine, on_disk = self._image_before_load()
        if engine is not None:
            return engine.distilled
        return True if on_disk is None else on_disk

    def image_default_steps(self) -> int:
        """The image model's default steps: 50 for a non-distilled checkpoint (image/loading.py), known before
        it loads where its model_index.json is on disk, so a page built then offers the right number at once."""
        engine, on_disk = self._image_before_load()
        if engine is not None:
            return engine.default_steps
        return self.settings.default_steps if on_disk is None else loading.default_steps(on_disk, self.settings)

    def _image_before_load(self) -> tuple[object | None, bool | None]:
        """(the image engine once it serves, else None; before that, ``is_distilled`` read from the checkpoint's
        model_index.json where it is on this machine, else None)."""
        with self._lock:
            engine = self._engines.get("image")
        placement = self.placements.get("image")
        if engine is not None or placement is None or placement.kind == "remote" or self.settings.demo:
            return engine, None  # the demo pipeline is distilled, as the fallback says
        folder = self._folders.get("image")
        if folder is not None:
            return None, loading.distilled_on_disk(folder / "model_index.json")
        model, revision = asked_model(self.settings, "image")
        return None, loading.distilled_on_disk(file_on_disk(model, "model_index.json", revision))

    def cancel(self, name: str) -> bool:
        with self._lock:
            engine = self._engines.get(name)
        return bool(engine and engine.cancel())

    def shape_states(self, name: str) -> dict[str, dict]:
        """Per shape: state (queued/running/ready/failed/skipped), error and ETA (image workers: as they say)."""
        if name == "image" and self.remote(name):
            return self._remote.shape_states()
        out = {}
        for task in self.runner.tasks:
            if task.engine == name and task.kind == "compile":
                out[task.shape] = {"state": task.state, "error": task.error,
                                   "eta_s": self.runner.eta_until(name, task.shape)}
        return out

    def readiness(self) -> tuple[bool, dict]:
        """Whether every enabled engine serves every declared shape, and /readyz's body: the one answer that
        /readyz, /status, MCP's warmup_status and the page's header give. The body's ``shapes`` is
        ``shape_readiness()``."""
        ready, body = readiness(self.runner.tasks)
        body["shapes"] = self.shape_readiness()
        return ready, body

    def shape_readiness(self) -> dict[str, dict[str, dict]]:
        """Per enabled engine, per declared shape label: its state (ready, queued, running, failed) and
        ETA in seconds (``metrics.shape_readiness``); no error texts: /readyz's body is open."""
        # an engine whose weights or load failed: its shapes fail, also those the warm-up has yet to skip
        failed = {t.engine for t in self.runner.tasks
                  if t.kind in ("weights", "load") and t.state in ("failed", "skipped")}
        return {name: {label: shape_readiness(state, name in failed)
                       for label, state in self.shape_states(name).items()}
                for name in ENGINES if name in self.placements}

    def status(self) -> dict:
        """The warm-up snapshot plus what runs where (JSON-serialisable)."""
        snap = self.runner.snapshot()
        engines = {name: self._engine_state(name) for name in ENGINES}
        serves_all = readiness(self.runner.tasks)[0]  # self.readiness() would also work out every ETA
        snap.update(
            # ready: /readyz's answer (every enabled engine serves every declared shape; a failed one is not)
            warmup_done=snap["ready"],
            ready=serves_all and all(e["state"] in ("ready", "disabled") for e in engines.values()),
            fallbacks=dict(self.fallbacks),
            banner=self.banner(),
            demo=any(self.runs_demo(name) for name in self.placements),
            models={name: self.model_id(name) for name in self.placements},
            models_reason=self.settings.models_reason if any(self.runs_demo(name) and not self.remote(name)
                                                             for name in self.placements)
            else tr("the servers this page uses run demo models") if any(map(self.runs_demo, self.placements))
            else self.settings.models_reason,
            device=self.description,
            cache_dir=str(self.settings.cache_dir),
            cache_problem=self.cache.problem,
            cache_notes=list(self.cache.notes),  # a preset cache folder kept, lock files moved to local disk
            counters=devices.device_counters(self.placements),
            engines=engines,
            limits=self.limits(),
        )
        for hook in self.hooks:
            snap = hook.annotate(snap)
        return snap

    def model_folders(self) -> dict[str, Path]:
        """The folder each engine's weights were loaded from (filled as warm-up obtains them)."""
        return dict(self._folders)

    def limits(self) -> dict:
        """What a request may ask for (the QA CLI plans its cells with these): sizes, steps, tokens, text."""
        s = self.settings
        return {"sizes": [size.label for size in s.sizes], "default_steps": self.image_default_steps(),
                "max_steps": s.max_steps, "references": list(s.references),  # counts /edit_image takes
                "max_new_tokens": s.max_new_tokens, "max_prompt_chars": s.max_prompt_chars,
                "engines": [name for name in ENGINES if name in self.placements]}

    def engine_states(self) -> dict[str, str]:
        """Each engine's state: disabled, loading, ready or failed."""
        return {name: self._engine_state(name)["state"] for name in ENGINES}

    def _engine_state(self, name: str) -> dict:
        try:
            self.engine(name)
        except EngineUnavailableError as exc:
            state = "disabled" if name not in self.placements else "failed" if "failed" in str(exc) else "loading"
            return {"state": state, "reason": exc.args[0]}  # a Message (str): the page shows it in its language
        return {"state": "ready", "reason": None, "placement": self.placements[name].label()}


class ImageCall:
    """One image request (``request.count`` images) on its own thread: the web handler polls ``wait()``, reads
    ``progress`` and ``preview`` (the latest frame); ``cancel()`` stops this request only, at the next step, or
    drops it if it has not started."""

    def __init__(self, backend: Backend, request, preview: bool = False):
        self.progress: tuple[int, int, float] | None = None  # (step, total, elapsed_s), over the whole run
        self.preview = None  # the latest image.preview.PreviewFrame (assigned whole: safe to read from any thread)
        self._cancel = threading.Event()
        self._results: list = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(backend, request, preview), name="image-call",
                                        daemon=True)
        self._thread.start()

    def _run(self, backend: Backend, request, preview: bool) -> None:
        def on_step(step: int, total: int, elapsed: float) -> None:
            self.progress = (step, total, elapsed)

        def on_preview(frame) -> None:
            self.preview = frame

        try:
            self._results = backend.generate_images(request, on_step, self._cancel, on_preview if preview else None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            self._error = exc

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; return whether the call has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def cancel(self) -> None:
        self._cancel.set()

    def result(self):
        """The (first) ImageResult, or the exception the request raised."""
        return self.results()[0]

    def results(self) -> list:
        """Every ImageResult of the run (fewer than asked when stopped), or the exception it raised."""
        if self._error is not None:
            raise self._error
        return list(self._results)
