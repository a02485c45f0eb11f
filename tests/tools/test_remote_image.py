"""--image-server: the images come from workers (this app with --no-chat) through gradio_client, routed to a
worker warm for the request's size with the fewest of this server's images running; progress, preview, stop
and refusals cross the boundary; a worker lost mid-image gives way to another warm one or a clear error.

Two workers run in this process on loopback: one warm for 96x64 only, one for 64x64 and 96x64."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support.app import app_settings, start_app

from neuron_backend.errors import CancelledError, EngineUnavailableError, InvalidRequestError, ShapeNotReadyError
from neuron_backend.image.engine import ImageRequest
from tools.remote.image import RemoteImageEngine, Worker, WorkerLost
from tools.remote.plugin import servers

STEPS = 400  # ~5 s on the demo model: an image still running is plain to see


# ----- routing, without workers -----------------------------------------------------------------------------
def _engine(*urls: str) -> RemoteImageEngine:
    settings = app_settings(["--models", "tiny", "--no-chat", "--sizes", "64x64,96x64", "--image-server",
                             ",".join(urls)])
    return RemoteImageEngine(settings, servers(settings).images)


def _known(engine: RemoteImageEngine, url: str, running: int = 0, **shapes: dict) -> Worker:
    worker = engine.workers[url]
    worker.client, worker.looked, worker.running = object(), time.monotonic() + 3600, running  # fresh for an hour
    worker.shapes = {label.replace("_", "x").removeprefix("s"): state for label, state in shapes.items()}
    return worker


def test_a_request_goes_to_the_least_busy_worker_warm_for_its_size():
    engine = _engine("http://a:1", "http://b:1", "http://c:1")
    ready, warming = {"state": "ready", "eta_s": 0.0}, {"state": "running", "eta_s": 40.0}
    _known(engine, "http://a:1", running=2, s96_64=ready, s64_64=ready)
    _known(engine, "http://b:1", running=1, s96_64=ready, s64_64=warming)
    _known(engine, "http://c:1", running=0, s96_64=warming)
    assert engine.pick("96x64", set()).url == "http://b:1"  # c is idle but cold for it
    assert engine.pick("64x64", set()).url == "http://a:1"  # the only one warm for it, however busy
    assert engine.pick("96x64", {"http://b:1"}).url == "http://a:1"  # b failed this request already
    with pytest.raises(ShapeNotReadyError, match="about 40 s"):
        engine.pick("64x64", {"http://a:1"})
    with pytest.raises(EngineUnavailableError, match="No image worker serves 128x128"):
        engine.pick("128x128", set())


def test_a_lost_worker_is_left_out_until_its_readyz_answers_again():
    engine = _engine("http://127.0.0.1:9", "http://b:1")  # port 9 (discard): nothing answers there
    ready = {"state": "ready", "eta_s": 0.0}
    lost = _known(engine, "http://127.0.0.1:9", s96_64=ready)
    _known(engine, "http://b:1", running=5, s96_64=ready)
    lost.lost = "ConnectError: connection refused"
    assert engine.pick("96x64", set()).url == "http://b:1"  # idle, but it failed and does not answer yet


def test_an_image_lost_with_its_worker_starts_over_on_another_warm_worker_or_says_which_failed():
    engine = _engine("http://a:1", "http://b:1")
    ready = {"state": "ready", "eta_s": 0.0}
    _known(engine, "http://a:1", s96_64=ready)
    _known(engine, "http://b:1", running=1, s96_64=ready)
    tried = []

    def run_on(worker, request, progress, cancel, preview):
        tried.append(worker.url)
        if worker.url == "http://a:1":
            raise WorkerLost("RemoteProtocolError: peer closed connection")
        return ["made on " + worker.url]

    engine._run_on = run_on
    engine._look = lambda worker: (_ for _ in ()).throw(OSError("refused"))  # a lost worker stays unreachable
    assert engine.generate_run(ImageRequest("a cat", "96x64", steps=4)) == ["made on http://b:1"]
    assert tried == ["http://a:1", "http://b:1"] and engine.workers["http://a:1"].lost
    engine.workers["http://b:1"].lost = None
    engine._run_on = lambda worker, *args: (_ for _ in ()).throw(WorkerLost("peer closed connection"))
    with pytest.raises(EngineUnavailableError, match=r"The image worker at http://b:1 stopped answering mid-image "
                                                     r"\(peer closed connection\) and no other worker is warm"):
        engine.generate_run(ImageRequest("a cat", "96x64", steps=4))


class SilentJob:
    """A worker's job that sends nothing: queued there, or its worker frozen (SIGSTOP, a node gone without a FIN)."""

    def __init__(self, done_after: float = float("inf")):
        self.until, self.cancelled = time.monotonic() + done_after, False

    def done(self) -> bool:
        return self.cancelled or time.monotonic() > self.until

    def outputs(self) -> list:
        return []

    def cancel(self) -> None:
        self.cancelled = True


@pytest.mark.slow
def test_a_worker_silent_before_its_first_update_is_lost_only_when_its_healthz_is_silent_too(monkeypatch):
    monkeypatch.setattr("tools.remote.image.STALL_S", 0.2)
    engine = _engine("http://127.0.0.1:9")  # port 9 (discard): its /healthz does not answer
    worker = _known(engine, "http://127.0.0.1:9", s96_64={"state": "ready", "eta_s": 0.0})
    job = SilentJob()
    engine._submit = lambda *args: job
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(_raised(
        engine._run_on, worker, ImageRequest("a cat", "96x64"), None, threading.Event(), None)), daemon=True)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the image waited on a frozen worker with no end"
    assert isinstance(outcome[0], WorkerLost) and "its /healthz does not answer" in str(outcome[0]), outcome
    assert job.cancelled and worker.running == 0

    # A worker that answers /healthz while the image waits in its queue is waited for, past STALL_S.
    monkeypatch.setattr(RemoteImageEngine, "_alive", staticmethod(lambda worker: True))
    engine._submit = lambda *args: SilentJob(done_after=0.8)
    engine._outcome = lambda worker, job: ("made", {"seed": 1})
    engine._result = lambda worker, path, params, started: path
    assert [str(p) for p in engine._run_on(worker, ImageRequest("a cat", "96x64"), None, threading.Event(),
                                           None)] == ["made"]


def _raised(call, *args):
    try:
        return call(*args)
    except Exception as exc:  # noqa: BLE001 - the test reads what the call raised
        return exc


def test_the_front_checks_a_request_against_its_own_flags_first():
    engine = _engine("http://a:1")
    with pytest.raises(InvalidRequestError, match="Allowed sizes: 64x64, 96x64"):
        engine.validate(ImageRequest("a cat", "128x128"))
    with pytest.raises(InvalidRequestError, match="Steps"):
        engine.validate(ImageRequest("a cat", "64x64", steps=0))


# ----- two workers on loopback ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    root = tmp_path_factory.mktemp("image-workers")
    one = start_app(root / "one", "--no-chat", "--sizes", "96x64", "--max-steps", str(STEPS))
    two = start_app(root / "two", "--no-chat", "--max-steps", str(STEPS), "--max-images-per-run", "1",
                    "--references", "0,1")
    urls = [one[2].rstrip("/"), two[2].rstrip("/")]
    front = start_app(root / "front", "--no-chat", "--max-steps", str(STEPS), "--image-server", ",".join(urls),
                      "--references", "0,1")
    yield front[1], one[1], two[1], urls, front[2]
    for demo, _, _ in (front, one, two):
        demo.close()


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.slow
def test_the_front_connects_to_each_worker_and_reports_its_sizes(workers):
    front, _, _, urls = workers[:4]
    tasks = [(t.name, t.state, t.detail, t.progress) for t in front.runner.tasks]
    assert tasks == [(f"image · connect to {urls[0]}", "ready", f"1/1 sizes ready at {urls[0]}", 1.0),
                     (f"image · connect to {urls[1]}", "ready", f"4/4 sizes ready at {urls[1]}", 1.0)], tasks
    assert front.status()["ready"] and front.model_id("image") == "demo FLUX.2-klein (tiny, random weights)"
    states = front.shape_states("image")  # as the size picker and this server's /readyz read them
    assert {label: state["state"] for label, state in states.items()} == {
        "96x64": "ready", "64x64": "ready", "64x64+1ref": "ready", "96x64+1ref": "ready"}
    assert front.placements["image"].label() == ",".join(urls) + " · image workers"


@pytest.mark.slow
def test_an_image_comes_from_the_warm_worker_with_progress_preview_and_the_same_pixels(workers):
    front, _, two, urls = workers[:4]
    call = front.start_image(ImageRequest("a lighthouse at dusk", "64x64", steps=6, seed=11), preview=True)
    frames = []
    while not call.wait(0.02):
        if call.preview is not None and (not frames or frames[-1] is not call.preview):
            frames.append(call.preview)
    [result] = call.results()
    assert result.params["worker"] == urls[1]  # only the second worker declares 64x64
    assert call.progress[:2] == (6, 6) and frames and frames[-1].image().size == (8, 8)
    assert result.path is not None and result.path.is_relative_to(front.settings.cache_dir / "outputs")
    direct = two.generate_image(ImageRequest("a lighthouse at dusk", "64x64", steps=6, seed=11))
    assert np.array_equal(np.asarray(result.image), np.asarray(direct.image.convert("RGB")))


@pytest.mark.slow
def test_two_images_at_once_run_on_two_workers(workers):
    front, one, two, urls = workers[:4]
    calls = [front.start_image(ImageRequest("slow", "96x64", steps=STEPS, seed=i)) for i in (1, 2)]
    _wait(lambda: one.engine("image").busy and two.engine("image").busy)  # both at once: one on each
    for call in calls:
        call.cancel()
    for call in calls:
        assert call.wait(10)
        with pytest.raises(CancelledError):
            call.results()


@pytest.mark.slow
def test_stop_frees_the_worker_within_a_step(workers):
    front, _, two, _ = workers[:4]
    engine = two.engine("image")
    call = front.start_image(ImageRequest("slow", "64x64", steps=STEPS, seed=3))
    _wait(lambda: engine.busy and call.progress is not None)
    stopped = time.monotonic()
    call.cancel()
    _wait(lambda: not engine.busy, timeout=15)
    assert time.monotonic() - stopped < 2.0, "the worker ran on after the stop"
    assert call.wait(5)
    with pytest.raises(CancelledError, match="dropped the image"):
        call.results()


@pytest.mark.slow
def test_a_workers_refusal_arrives_in_its_own_words(workers):
    front, _, _, _ = workers[:4]
    with pytest.raises(InvalidRequestError, match="Images per run"):  # the 64x64 worker makes one per run
        front.generate_images(ImageRequest("a cat", "64x64", steps=2, count=2))
    done = threading.Event()
    front.start_image(ImageRequest("a cat", "64x64", steps=2)).wait(30) and done.set()
    assert done.is_set()  # and it serves the next request


@pytest.mark.slow
def test_an_edit_goes_to_a_worker_that_edits_and_gives_its_pixels(workers):
    from PIL import Image

    from neuron_backend.image.references import ReferenceImage

    front, _, two, urls = workers[:4]
    reference = ReferenceImage(Image.new("RGB", (40, 30), (200, 40, 40)), "letterbox", name="red.png")
    request = ImageRequest("make it blue", "96x64", steps=3, seed=5, references=(reference,))
    [result] = front.generate_images(request)  # 96x64+1ref: only the second worker declares editing
    assert result.params["worker"] == urls[1] and result.params["references"][0]["fit"] == "letterbox"
    direct = two.generate_image(request)
    assert np.array_equal(np.asarray(result.image), np.asarray(direct.image.convert("RGB")))


@pytest.mark.slow
def test_the_pages_queue_runs_as_many_images_at_once_as_it_has_workers(workers):
    """Through the page's Gradio queue (its /generate_image), not only the engine: with a queue slot for one
    image, the second waited for the first and two workers made images at the speed of one."""
    from gradio_client import Client

    _, one, two, _, url = workers
    jobs = [Client(url, verbose=False).submit(prompt="slow", size="96x64", steps=STEPS, seed=i,
                                              api_name="/generate_image") for i in (1, 2)]
    try:
        _wait(lambda: one.engine("image").busy and two.engine("image").busy)
    finally:
        for job in jobs:
            job.cancel()
    _wait(lambda: not (one.engine("image").busy or two.engine("image").busy), timeout=15)
