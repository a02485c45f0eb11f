"""An image cancelled right after submit runs nothing.

gradio_client's ``job.cancel()`` in the first ~50 ms after ``submit()`` posts ``/gradio_api/cancel``
with ``event_id: null`` (the join's answer has not been read yet); Gradio 6.31 answers 422 and
the job ran all its steps (400 steps, 5.7 s here before the fix). ``ui.guards.EarlyCancels`` matches
such a cancel to the job it meant; the API handlers drop it at their start.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from gradio_client import Client
from support.app import start_app

from ui.guards import EarlyCancels, Guards

STEPS = 400  # ~5 s on the demo model: a job that runs whole is plain to see


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_cancel_without_an_id_takes_the_job_that_session_just_joined():
    clock = Clock()
    cancels = EarlyCancels(window_s=2.0, clock=clock)
    cancels.joined("old", "s1", 7)
    clock.now += 3.0  # "old" joined 3 s ago: outside the window, so it is not this cancel's job
    cancels.joined("e1", "s1", 7)
    cancels.joined("other-fn", "s1", 8)
    cancels.joined("other-session", "s2", 7)
    assert cancels.cancelled("s1", 7) == "e1"
    assert cancels.take("e1") and not cancels.take("e1")  # asked once, at the handler's start
    assert not any(cancels.take(e) for e in ("old", "other-fn", "other-session", None))


def test_a_cancel_before_the_join_takes_the_next_join_within_the_window():
    clock = Clock()
    cancels = EarlyCancels(window_s=2.0, clock=clock)
    assert cancels.cancelled("s1", 7) is None  # the client's join is still on its way
    clock.now += 0.5
    cancels.joined("e1", "s1", 7)
    assert cancels.take("e1")
    cancels.joined("e2", "s1", 7)  # the cancel was used up: the next job runs
    assert not cancels.take("e2")
    cancels.cancelled("s1", 7)  # e2 joined 0 s ago: taken
    assert cancels.take("e2")
    assert cancels.cancelled("s1", 7) is None
    clock.now += 2.5  # a join after the window is a new job
    cancels.joined("e3", "s1", 7)
    assert not cancels.take("e3")


def _post(guards: Guards, path: str, body: dict) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": json.dumps(body).encode()}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "client": ("127.0.0.1", 1)}
    asyncio.run(guards(scope, receive, send))
    return sent


def test_the_guard_fills_in_the_event_id_gradio_needs():
    seen: list[dict] = []

    async def gradio(scope, receive, send):  # stands in for Gradio's routes: echoes what it was sent
        body = json.loads((await receive())["body"])
        seen.append(body)
        answer = json.dumps({"event_id": "e1"} if scope["path"].endswith("join") else {"success": True}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})

    guards = Guards(gradio, EarlyCancels())
    _post(guards, "/gradio_api/queue/join", {"fn_index": 7, "session_hash": "s1", "data": []})
    _post(guards, "/gradio_api/cancel", {"fn_index": 7, "session_hash": "s1", "event_id": None})
    assert seen[-1] == {"fn_index": 7, "session_hash": "s1", "event_id": "e1"}  # Gradio drops it from its queue
    assert guards.early_cancels.take("e1")  # and the handler drops it if it had started
    _post(guards, "/gradio_api/cancel", {"fn_index": 7, "session_hash": "s1", "event_id": "e9"})
    assert seen[-1]["event_id"] == "e9"  # a cancel that names its job passes as it came
    _post(guards, "/gradio_api/cancel", {"fn_index": 7, "session_hash": "s2"})
    assert seen[-1]["event_id"] == ""  # no job yet: a valid body (no 422), and the next join is taken


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    demo, backend, url = start_app(tmp_path_factory.mktemp("early-cancel"), "--no-chat", "--max-steps", str(STEPS),
                                   "--references", "0,1")
    calls = []
    start_image = backend.start_image

    backend.started_calls = []  # the ImageCall each request became: its progress says how many steps it ran

    def counting(request, preview=False):
        calls.append(request)
        call = start_image(request, preview)
        backend.started_calls.append(call)
        return call

    backend.start_image = counting  # what the handler starts, seen from the outside
    fn_index = next(i for i, d in enumerate(demo.config["dependencies"]) if d.get("api_name") == "generate_image")
    yield backend, url, fn_index, calls, demo
    demo.close()


def _wait_free(engine, timeout: float) -> float:
    started = time.monotonic()
    time.sleep(0.05)
    while engine.busy and time.monotonic() - started < timeout:
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.slow
def test_a_cancel_that_comes_before_the_join_runs_no_step(served):
    backend, url, fn_index, calls, _ = served
    before = len(calls)
    session = f"early-{time.monotonic_ns()}"
    with httpx.Client(base_url=url, timeout=10) as http:
        cancel = http.post("gradio_api/cancel", json={"fn_index": fn_index, "session_hash": session, "event_id": None})
        assert cancel.status_code == 200, cancel.text  # Gradio alone answers 422 and forgets it
        joined = http.post("gradio_api/queue/join", json={
            "data": ["slow", "96x64", STEPS, 2, None, 1, False], "fn_index": fn_index, "session_hash": session,
            "event_data": None, "trigger_id": None})
        assert joined.status_code == 200, joined.text
        with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as stream:
            done = None
            for count, line in enumerate(stream.iter_lines()):  # bounded: 200 lines, 10 s per read
                if '"process_completed"' in line:
                    done = json.loads(line.removeprefix("data:"))
                    break
                assert count < 200, "no process_completed message"
    assert done["success"] is False and "Cancelled before it started" in json.dumps(done)
    assert len(calls) == before  # the handler never started the image


@pytest.mark.slow
def test_gradio_client_cancel_right_after_submit_frees_the_engine_at_once(served):
    backend, url, _, _, _ = served
    client = Client(url, verbose=False)
    engine = backend.engine("image")
    for delay in (0.0, 0.01, 0.03):  # before the client knows its event id, and around the moment it learns it
        started = len(backend.started_calls)
        job = client.submit(prompt="slow", size="96x64", steps=STEPS, seed=2, guidance=None,
                            api_name="/generate_image")
        time.sleep(delay)
        job.cancel()
        # A whole run takes ~5 s here. Judged by the steps it ran, not by a clock: on a loaded machine a stopped
        # run's last steps can take seconds, and a run that was never stopped runs all STEPS however fast.
        assert _wait_free(engine, 60.0) < 60.0, "the engine stayed busy"
        ran = [call.progress[0] if call.progress else 0 for call in backend.started_calls[started:]]
        assert all(steps < STEPS // 2 for steps in ran), f"cancel {delay} s after submit: the image ran on ({ran})"



@pytest.mark.parametrize("endpoint", ["generate_image", "edit_image"])
def test_closing_the_handler_at_a_yield_stops_the_image_at_once(served, endpoint):
    """Gradio cancels an event by cancelling its task; when that lands while the handler waits at a yield
    (Gradio is sending its last update), Gradio closes the handler with ``aclose()``. That close must reach
    ImageRun's ``finally`` through every wrapper at once, not when the garbage collector finds the inner
    generators: the image ran all its steps (seen over MCP, whose cancel goes through the same /cancel)."""
    import gc

    backend, _, _, calls, demo = served
    handler = next(f.fn for f in demo.fns.values() if f.api_name == endpoint)
    engine = backend.engine("image")
    arguments = {"prompt": "slow", "size": "96x64", "steps": STEPS, "seed": 2}
    if endpoint == "edit_image":
        arguments["references"] = []

    async def gradio_cancels_at_a_yield():
        outer = handler(**arguments)
        before = len(calls)
        while True:  # the handler now waits at its yield
            await anext(outer)
            if len(calls) > before and engine.busy:
                break
        await outer.aclose()
        # Waited for here, holding the loop: a generator closed later (by the loop's finalizer hook, or at
        # the loop's end) does not count.
        return _wait_free(engine, 15.0)

    gc.disable()  # nor does one the collector finds
    try:
        assert asyncio.run(gradio_cancels_at_a_yield()) < 2.0, "the image ran on after its handler was closed"
    finally:
        gc.enable()


def test_a_cancel_that_lands_between_two_updates_stops_the_image(served):
    """Gradio cancels an event's task wherever it waits. Between two updates of the handler (postprocessing
    its first update, before Gradio keeps the handler to close it) the cancel reaches neither the handler nor
    its close: the image ran all its steps (one MCP disconnect in six). The task's end must stop it."""
    import gc

    backend, _, _, calls, demo = served
    handler = next(f.fn for f in demo.fns.values() if f.api_name == "generate_image")
    engine = backend.engine("image")
    kept = []  # the handler, never closed: as Gradio leaves it when the cancel lands in its own code

    async def event():
        outer = handler(prompt="slow", size="96x64", steps=STEPS, seed=2)
        kept.append(outer)
        before = len(calls)
        while True:
            await anext(outer)
            if len(calls) > before and engine.busy:
                break
        await asyncio.sleep(30)  # Gradio's own work after an update: the cancel lands here

    async def gradio_cancels_outside_the_handler():
        task = asyncio.create_task(event())
        while not (kept and engine.busy):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # past the first update: the handler waits at its yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        return _wait_free(engine, 15.0)  # holding the loop: a close by the loop's finalizer does not count

    gc.disable()  # nor does one the collector finds
    try:
        assert asyncio.run(gradio_cancels_outside_the_handler()) < 2.0, "the image ran on after its event ended"
    finally:
        gc.enable()
        kept.clear()
