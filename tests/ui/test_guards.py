"""The guards in front of Gradio's routes: login backoff, and a job cancelled only by the login that started it."""

from __future__ import annotations

import time

import httpx
import pytest
from gradio_client import Client
from support.app import warm_backend

import ui
from ui.guards import LoginThrottle


def _login(url: str, password: str, client: httpx.Client | None = None) -> httpx.Response:
    post = (client or httpx).post
    return post(f"{url}login", data={"username": "ada", "password": password}, timeout=10)


@pytest.mark.slow
def test_repeated_login_failures_get_refused_until_the_window_passes(tmp_path, demo_models):
    """20 wrong passwords from one client: after 5 each further try waits, doubling."""
    backend = warm_backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image")
    throttle = LoginThrottle(free_failures=5, base_delay_s=3.0, max_delay_s=6.0)  # 3 s: 14 requests fit
    demo, (_, url, _) = ui.serve(backend, throttle=throttle, prevent_thread_lock=True, quiet=True)
    try:
        codes = [_login(url, f"wrong-{i}").status_code for i in range(20)]
        assert codes[:5] == [400] * 5  # wrong, but not yet slowed down
        assert codes[5] == 400 and set(codes[6:]) == {429}, codes  # the 6th failure starts the lock
        locked = _login(url, "lovelace")
        assert locked.status_code == 429 and "try again in" in locked.json()["detail"]  # even the right one
        assert int(locked.headers["retry-after"]) >= 1
        deadline = time.monotonic() + 10
        while throttle.retry_after("127.0.0.1") > 0:  # the lock's own clock, not a guessed sleep
            assert time.monotonic() < deadline
            time.sleep(throttle.retry_after("127.0.0.1"))
        assert _login(url, "lovelace").status_code == 200  # after the window the right password works
        assert throttle.retry_after("127.0.0.1") == 0 and _login(url, "wrong").status_code == 400  # forgotten
    finally:
        demo.close()


def test_login_throttle_doubles_and_is_capped():
    now = [0.0]
    throttle = LoginThrottle(free_failures=2, base_delay_s=1.0, max_delay_s=4.0, clock=lambda: now[0])
    waits = []
    for _ in range(6):
        throttle.failed("a")
        waits.append(throttle.retry_after("a"))
    assert waits == [0.0, 0.0, 1.0, 2.0, 4.0, 4.0]
    assert throttle.retry_after("b") == 0.0  # per client
    now[0] += 3.0
    assert throttle.retry_after("a") == 1.0
    throttle.succeeded("a")
    assert throttle.retry_after("a") == 0.0


@pytest.mark.slow
def test_with_auth_only_the_login_that_started_a_job_can_cancel_it(tmp_path, demo_models):
    """Gradio 6.31's /gradio_api/cancel checks no login; the guard does."""
    backend = warm_backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image", "--context-length", "4096",
                       "--max-new-tokens", "4000")
    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)
    engine = backend.engine("chat")
    try:
        owner, other = (Client(url, auth=("ada", "lovelace"), verbose=False) for _ in range(2))
        job = owner.submit(message="long story", greedy=True, max_new_tokens=4000, api_name="/chat")
        deadline = time.time() + 60
        while not job.outputs():  # streaming: the engine is busy with this reply
            assert time.time() < deadline
            time.sleep(0.02)
        body = {"session_hash": owner.session_hash, "fn_index": owner._infer_fn_index("/chat", None),
                "event_id": job.communicator.event_id}
        cancel = f"{url}gradio_api/cancel"
        assert httpx.post(cancel, json=body, timeout=10).status_code == 401  # no login at all
        assert httpx.post(cancel, json=body, cookies=other.cookies, timeout=10).status_code == 403  # another login
        assert engine.busy and not job.done()
        job.cancel()  # the owner's own cancel goes through
        deadline = time.time() + 10
        while engine.busy:
            assert time.time() < deadline
            time.sleep(0.02)
    finally:
        demo.close()
