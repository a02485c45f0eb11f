"""The image engine of ``--image-server URL[,URL…]``: images come from workers (this app started with
``--no-chat``) through ``gradio_client``, with their progress and live preview, as the in-process engine makes them.

Routing: a worker serves a request only once its own ``/readyz`` says the request's shape (``96x64``,
``1024x1024+1ref``) is ready; among those, the one with the fewest of this server's images running goes first (each
UI replica counts its own). A worker that fails mid-image (its connection breaks, or it sends nothing for
``STALL_S``; before its first update, only if its ``/healthz`` is silent too) is left out until its ``/readyz``
answers again, and the image starts over on another warm worker; with none left the user reads which worker failed
and what to do. A stop cancels the worker's job (``job.cancel()``), which stops the image there within a step. The
result's parameters name the worker.

What the worker decides, the worker says: its refusals arrive in its own words (``gradio_client``'s ``AppError``),
its steps' default, its compiled sizes. The front checks a request against its own flags first (give it the
workers' ``--sizes`` and ``--references``), so the page offers only what the workers serve.
"""

from __future__ import annotations

import base64
import io
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from neuron_backend.errors import (
    CancelledError,
    EngineUnavailableError,
    InvalidRequestError,
    ShapeNotReadyError,
    UnsupportedSizeError,
    whole_number,
)
from neuron_backend.image.engine import SEED_MAX, ImageRequest, ImageResult
from neuron_backend.image.inputs import clean_prompt, guidance_value
from neuron_backend.image.png_info import OutputFolder
from neuron_backend.image.references import (
    ReferenceFile,
    check_reference_count,
    check_reference_pixels,
    reference_pixel_limit,
)
from neuron_backend.messages import tr
from neuron_backend.settings import Settings
from neuron_backend.shapes import image_shape, parse_size

from .bounded import BodyTooLarge, get_json

log = logging.getLogger("showcase.image")

CONNECT_TIMEOUT_S = 5.0  # one /readyz look
POLL_S = 1.0  # how often connect() looks again at a worker that is unreachable or warming up
GIVE_UP_S = 600.0  # an unreachable worker fails its connect task after this long (a warming one is waited for)
READY_TTL_S = 1.0  # a worker's /readyz answer is reused this long when routing
STALL_S = 30.0  # a running image whose worker sends no update for this long has lost its worker
JOB_POLL_S = 0.05  # how often a running image looks at its job's updates


@dataclass
class Worker:
    """One image worker as this server sees it."""

    url: str
    client: object | None = None  # its gradio_client.Client, once connected
    shapes: dict[str, dict] = field(default_factory=dict)  # its /readyz "shapes" of the image engine
    looked: float = 0.0  # when ``shapes`` was read (time.monotonic())
    running: int = 0  # this server's images running there now
    lost: str | None = None  # why it is left out of routing (it failed mid-image), until /readyz answers again


@dataclass
class RemoteFrame:
    """A preview frame as a worker sends it (a small PNG), with what ``image/preview.PreviewFrame`` offers."""

    step: int
    total: int
    width: int
    height: int
    index: int
    png: Image.Image

    def image(self) -> Image.Image:
        return self.png


class WorkerLost(Exception):
    """The worker failed mid-image (not a refusal): another warm worker may make it."""


class RemoteImageEngine:
    """Images from workers; ``connect(url)`` each (the warm-up's tasks do), then ``generate_run``."""

    name = "image"

    def __init__(self, settings: Settings, urls: tuple[str, ...]):
        self.settings = settings
        self.workers = {url: Worker(url) for url in urls}
        self.outputs = OutputFolder(Path(settings.cache_dir) / "outputs", settings.max_saved_images)
        self.default_steps = settings.default_steps
        self.distilled = True  # FLUX.2-klein: guidance is ignored (a worker's parameters say what it did)
        self.demo = False  # a worker runs a random-weight demo model (its /status says so)
        self.model: str | None = None  # what the workers run, as the first connected one says
        self.memory_note = None
        self._jobs: set = set()  # the gradio_client jobs running now (cancel)
        self._lock = threading.Lock()

    # ----- connecting ---------------------------------------------------------------------------------
    def connect(self, url: str, progress: Callable[[float, str], None] = lambda fraction, text: None) -> None:
        """Wait until the worker at ``url`` serves every shape it declares; EngineUnavailableError when it stays
        unreachable for ``GIVE_UP_S`` or is not an image worker. A worker that answers while it warms up is
        waited for, its progress reported."""
        worker, deadline = self.workers[url], time.monotonic() + GIVE_UP_S
        while True:
            try:
                shapes = self._look(worker)
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise self._unreachable(worker, exc) from None
                progress(0.0, tr("waiting for the image worker at {url}: {error}", url=url, error=exc))
            else:
                ready = sum(1 for shape in shapes.values() if shape.get("state") == "ready")
                failed = [label for label, shape in shapes.items() if shape.get("state") == "failed"]
                if ready + len(failed) == len(shapes):
                    self._open(worker)
                    said = tr("{ready}/{total} sizes ready at {url}", ready=ready, total=len(shapes), url=url)
                    progress(1.0, said + (tr(" (failed: {shapes})", shapes=", ".join(failed)) if failed else ""))
                    return
                etas = [s["eta_s"] for s in shapes.values() if s.get("eta_s")]
                eta = tr(", about {eta} s to go", eta=f"{max(etas):.0f}") if etas else ""
                progress(ready / len(shapes), tr("the image worker at {url} is warming up: {ready}/{total} sizes "
                                                 "ready{eta}", url=url, ready=ready, total=len(shapes), eta=eta))
                deadline = time.monotonic() + GIVE_UP_S  # it answers: only a worker gone quiet gives up
            time.sleep(POLL_S)

    def _look(self, worker: Worker) -> dict[str, dict]:
        """The worker's image shapes from its /readyz (OSError: unreachable; EngineUnavailableError: no images)."""
        import httpx

        try:  # at most MAX_BODY_BYTES read, no redirect followed (bounded.py)
            _, body = get_json(worker.url + "/readyz", CONNECT_TIMEOUT_S)
        except (httpx.HTTPError, BodyTooLarge) as exc:
            raise OSError(_short(exc)) from None
        shapes = (body.get("shapes") or {}).get("image") if isinstance(body, dict) else None
        if not shapes:
            raise EngineUnavailableError(tr("The server at {url} serves no images (its /readyz lists no image "
                                            "shapes): --image-server takes workers started with --no-chat.",
                                            url=worker.url))
        worker.shapes, worker.looked, worker.lost = shapes, time.monotonic(), None
        return shapes

    def _open(self, worker: Worker) -> None:
        if worker.client is None:
            from gradio_client import Client

            try:
                client = Client(worker.url, verbose=False, download_files=tempfile.mkdtemp(prefix="worker-"))
                status = client.predict(api_name="/status")
            except Exception as exc:  # noqa: BLE001 - gradio_client raises what httpx and its config parsing raise
                raise self._unreachable(worker, exc) from None
            # What the worker runs: the first connected one names the model and the steps' default.
            self.demo = self.demo or bool(status.get("demo"))
            self.model = self.model or (status.get("models") or {}).get("image")
            self.default_steps = (status.get("limits") or {}).get("default_steps", self.default_steps)
            worker.client = client

    def _unreachable(self, worker: Worker, exc: BaseException) -> EngineUnavailableError:
        return EngineUnavailableError(tr("The image worker at {url} cannot be reached ({error}): check that it runs "
                                         "and that --image-server names its base URL.", url=worker.url,
                                         error=str(exc) if type(exc) is OSError else _short(exc)))

    # ----- routing --------------------------------------------------------------------------------------
    def pick(self, label: str, tried: set[str]) -> Worker:
        """The connected worker warm for ``label`` with the fewest of this server's images running."""
        warm, etas = [], []
        for worker in self.workers.values():
            if worker.client is None or worker.url in tried:
                continue
            if worker.lost is not None or time.monotonic() - worker.looked > READY_TTL_S:
                try:
                    self._look(worker)
                except (OSError, EngineUnavailableError):
                    continue
            state = worker.shapes.get(label, {})
            if state.get("state") == "ready":
                warm.append(worker)
            elif state.get("eta_s") is not None:
                etas.append(state["eta_s"])
        if warm:
            return min(warm, key=lambda w: w.running)
        if etas:
            raise ShapeNotReadyError(tr("No image worker is warm for {shape} yet; the first should be in about "
                                        "{eta} s.", shape=label, eta=f"{min(etas):.0f}"), label)
        raise EngineUnavailableError(tr("No image worker serves {shape} now (workers: {urls}); try again "
                                        "shortly, or start one with that size in its --sizes.", shape=label,
                                        urls=", ".join(self.workers)))

    # ----- images ---------------------------------------------------------------------------------------
    def validate(self, request: ImageRequest) -> ImageRequest:
        s = self.settings
        size = parse_size(request.size)
        if size not in s.sizes:
            raise UnsupportedSizeError(tr("Image size {size} is not served here (each size is compiled ahead of "
                                          "time). Allowed sizes: {allowed}.", size=size.label,
                                          allowed=", ".join(x.label for x in s.sizes)))
        steps = None if request.steps is None else whole_number(tr("Steps"), request.steps, 1, s.max_steps)
        seed = None if request.seed is None else whole_number(tr("Seed"), request.seed, 0, SEED_MAX)
        guidance = None if request.guidance is None else guidance_value(request.guidance)
        count = whole_number(tr("Images per run"), request.count, 1, s.max_images_per_run)
        if request.references:
            check_reference_count(len(request.references), s.references)
            for reference in request.references:  # the workers' own limit: the same sizes
                check_reference_pixels(reference, reference_pixel_limit(s.sizes))
        return ImageRequest(clean_prompt(request.prompt, s.max_prompt_chars), size, steps, seed, guidance, count,
                            tuple(request.references))

    def generate(self, request, progress=None, cancel=None):
        return self.generate_run(request, progress, cancel)[0]

    def generate_run(self, request: ImageRequest, progress: Callable | None = None,
                     cancel: threading.Event | None = None, preview: Callable | None = None) -> list[ImageResult]:
        """``request.count`` images from the warm worker with the fewest running; on a lost worker, once more on
        each other warm worker."""
        request, cancel = self.validate(request), cancel or threading.Event()
        label = image_shape(request.size, len(request.references)).label
        tried: set[str] = set()
        while True:
            worker = self.pick(label, tried)
            try:
                return self._run_on(worker, request, progress, cancel, preview)
            except WorkerLost as exc:
                worker.lost, worker.looked = str(exc), 0.0
                tried.add(worker.url)
                log.warning("image worker %s lost mid-image: %s", worker.url, exc)
                try:
                    self.pick(label, tried)
                except (ShapeNotReadyError, EngineUnavailableError):
                    raise EngineUnavailableError(tr(
                        "The image worker at {url} stopped answering mid-image ({error}) and no other worker is "
                        "warm for {shape}; try again shortly.", url=worker.url, error=exc, shape=label)) from None

    def _run_on(self, worker: Worker, request: ImageRequest, progress, cancel: threading.Event,
                preview) -> list[ImageResult]:
        started = time.perf_counter()
        sent = Path(tempfile.mkdtemp(prefix="references-")) if request.references else None
        job = self._submit(worker, request, preview is not None, sent)
        with self._lock:
            self._jobs.add(job)
            worker.running += 1
        try:
            seen, heard = 0, time.monotonic()
            while not job.done():
                if cancel.is_set():
                    job.cancel()
                    raise CancelledError(tr("Stopped: the image worker at {url} dropped the image.", url=worker.url))
                updates = job.outputs()
                for update in updates[seen:]:
                    self._relay(update, request, progress, preview)
                if len(updates) > seen:
                    seen, heard = len(updates), time.monotonic()
                elif time.monotonic() - heard > STALL_S:
                    # Before its first update the image may wait in the worker's own queue (other pages' images):
                    # silence then is lost only when the worker's /healthz does not answer either (frozen, gone).
                    if seen or not self._alive(worker):
                        job.cancel()
                        raise WorkerLost(tr("no update for {s} s", s=f"{STALL_S:.0f}") if seen else
                                         tr("no update for {s} s, and its /healthz does not answer",
                                            s=f"{STALL_S:.0f}"))
                    heard = time.monotonic()
                time.sleep(JOB_POLL_S)
            paths, params = self._outcome(worker, job)
        finally:
            with self._lock:
                self._jobs.discard(job)
                worker.running -= 1
            if sent is not None:
                shutil.rmtree(sent, ignore_errors=True)
        if request.count == 1:
            paths, params = [paths], [params]
        return [self._result(worker, Path(p), dict(par), started) for p, par in zip(paths, params, strict=True)]

    def _submit(self, worker: Worker, request: ImageRequest, preview: bool, folder: Path | None):
        """The worker's job: /generate_image, or /edit_image with the references written to ``folder``."""
        common = {"size": request.size.label, "steps": request.steps, "seed": request.seed,
                  "guidance": request.guidance, "images": request.count, "preview": preview}
        if not request.references:
            return worker.client.submit(prompt=request.prompt, **common, api_name="/generate_image")
        from gradio_client import handle_file

        files = []
        for i, ref in enumerate(request.references):
            stem = (ref.name or f"reference-{i + 1}").replace("/", "_")
            if isinstance(ref, ReferenceFile):  # the file as sent, never decoded here
                (path := folder / f"{stem}.{ref.format.lower()}").write_bytes(ref.data)
            else:
                ref.image.save(path := folder / f"{stem}.png")
            files.append(handle_file(str(path)))
        return worker.client.submit(prompt=request.prompt, references=files,
                                    fit=",".join(ref.fit for ref in request.references), **common,
                                    api_name="/edit_image")

    @staticmethod
    def _alive(worker: Worker) -> bool:
        """Whether the worker's /healthz answers 200 within ``CONNECT_TIMEOUT_S``."""
        import httpx

        try:
            return get_json(worker.url + "/healthz", CONNECT_TIMEOUT_S)[0] == 200
        except (httpx.HTTPError, BodyTooLarge):
            return False

    def _outcome(self, worker: Worker, job):
        from gradio_client.exceptions import AppError

        try:
            return job.result()
        except AppError as exc:  # the worker refused it: its own words
            raise InvalidRequestError(str(exc).strip() or tr("The image worker at {url} refused the request.",
                                                            url=worker.url)) from None
        except Exception as exc:  # noqa: BLE001 - a broken connection or a worker that went away
            raise WorkerLost(_short(exc)) from None

    def _relay(self, update, request: ImageRequest, progress, preview) -> None:
        """One progress update of the worker's job to this server's callbacks."""
        data = update[1] if isinstance(update, (list, tuple)) and len(update) > 1 else None
        if not isinstance(data, dict) or data.get("status") != "running":
            return
        if progress is not None and data.get("total"):
            progress(int(data["step"]), int(data["total"]), float(data.get("elapsed_s") or 0.0))
        if preview is not None and isinstance(url := data.get("preview"), str) and "," in url:
            png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
            png.load()
            preview(RemoteFrame(int(data.get("preview_step") or 0), int(data.get("total") or 0),
                                request.size.width, request.size.height, int(data.get("preview_image") or 1) - 1,
                                png))

    def _result(self, worker: Worker, path: Path, params: dict, started: float) -> ImageResult:
        with Image.open(path) as png:
            image = png.convert("RGB")
        path.unlink(missing_ok=True)  # gradio_client's download: the PNG is saved again below, with the worker named
        params["worker"] = worker.url
        saved = self.outputs.save(image, params, stem=f"{params.get('size', 'image')}-s{params.get('seed', 0)}")
        if saved.problem:
            params["save_note"] = saved.problem
        return ImageResult(image=image, path=saved.path, params=params, seed=int(params.get("seed", 0)),
                           stopped=bool(params.get("stopped")), prompt_truncated=bool(params.get("prompt_truncated")),
                           seconds=time.perf_counter() - started, compiled_graphs=int(params.get("compiled_graphs", 0)))

    # ----- what the status and the metrics read -------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    def cancel(self) -> bool:
        """Stop every image this server runs on its workers (as the local engine stops the one it runs)."""
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()
        return bool(jobs)

    def shape_states(self) -> dict[str, dict]:
        """Per size label, as the workers last said: ready where one connected worker serves it, else the
        soonest ETA of one warming it up (what the size picker and this server's /readyz show)."""
        states: dict[str, dict] = {}
        for worker in self.workers.values():
            if worker.client is None or worker.lost is not None:
                continue
            for label, shape in worker.shapes.items():
                best = states.get(label)
                rank = {"ready": 0, "running": 1, "queued": 2}.get(shape.get("state"), 3)
                if best is None or rank < best["rank"] or (rank == best["rank"] and (shape.get("eta_s") or 0) <
                                                            (best["eta_s"] or 0)):
                    states[label] = {"rank": rank, "state": shape.get("state"), "eta_s": shape.get("eta_s")}
        return {label: {"state": s["state"], "eta_s": s["eta_s"], "error": None} for label, s in states.items()}

    def describe(self) -> dict:
        return {"loaded": True, "busy": self.busy, "workers": {
            w.url: {"connected": w.client is not None, "running": w.running, "lost": w.lost,
                    "ready": sorted(label for label, s in w.shapes.items() if s.get("state") == "ready")}
            for w in self.workers.values()}}


def _short(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"[:200]
