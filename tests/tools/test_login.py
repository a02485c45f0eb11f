"""Login hardening (tools/login), a plug-in installed only with --auth: login backoff, token expiry, a job
cancelled only by the login that started it; without --auth it adds no middleware at all."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest
from gradio_client import Client
from support.app import app_parts, app_settings, free_port, warm_backend

import ui
from neuron_backend.errors import ConfigError
from neuron_backend.plugins import Parts
from neuron_backend.runtime import Backend
from tools.login import plugin as login
from tools.login.guard import LoginGuard
from tools.login.throttle import LoginThrottle
from ui.guards import BodyLimit, Edge

ADA = ("127.0.0.1", "ada")  # the login backoff's key: (address, user name)


def _login(url: str, password: str, client: httpx.Client | None = None, user: str = "ada",
           headers: dict | None = None) -> httpx.Response:
    post = (client or httpx).post
    return post(f"{url}login", data={"username": user, "password": password}, headers=headers, timeout=10)


def _settings(root, *extra):
    """The tiny chat model's settings with every plug-in's flags (no warm-up: logins need no engine)."""
    return app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--no-image",
                         "--port", str(free_port()), *extra])


def _layers(app) -> list[type]:
    """The classes of a served app's built middleware stack, outermost first (built at its first request): the
    core's edge, the plug-ins' layers inside it, its body limit."""
    layers, layer = [], app.middleware_stack
    while layer is not None and hasattr(layer, "app"):
        layers.append(type(layer))
        layer = layer.app
    return layers


@pytest.fixture
def auth_app(tmp_path):
    """The page with --auth on the tiny chat model and the login plug-in's guard, its throttle and demo."""
    settings = _settings(tmp_path, "--auth", "ada:lovelace", "--login-max-age", "0.001")
    throttle = LoginThrottle(free_failures=2, base_delay_s=30.0, max_delay_s=60.0)
    demo, (_, url, _) = ui.serve(Backend(settings), login.plug(settings, throttle), prevent_thread_lock=True,
                                 quiet=True)
    try:
        yield url, throttle, demo
    finally:
        demo.close()


# ----- installed only with --auth ---------------------------------------------------------------------------
def test_the_plug_in_adds_its_guard_only_with_auth(tmp_path):
    assert login.plug(_settings(tmp_path)) == Parts()  # no --auth: no middleware, no login code on a request
    assert not any(m.cls is LoginGuard for m in app_parts(_settings(tmp_path)).middleware)
    guarded = app_parts(_settings(tmp_path, "--auth", "ada:lovelace"))
    assert [m.cls for m in guarded.middleware].count(LoginGuard) == 1


def test_login_max_age_is_checked_with_or_without_auth(tmp_path):
    assert login.login_max_age_h(_settings(tmp_path)) == 24.0
    assert login.login_max_age_h(_settings(tmp_path, "--login-max-age", "0.5")) == 0.5
    for value, problem in (("0", "is not positive"), ("-1", "is not positive"), ("nan", "is not positive"),
                           ("soon", "is not a number")):
        with pytest.raises(ConfigError, match=rf"--login-max-age: .*{problem}"):
            login.plug(_settings(tmp_path, "--login-max-age", value))
    assert login.login_max_age_h(app_settings(["--models", "tiny"], env={"SHOWCASE_LOGIN_MAX_AGE": "2"})) == 2.0


@pytest.mark.slow
def test_without_auth_a_served_app_has_no_login_guard(tmp_path):
    settings = _settings(tmp_path)
    demo, (_, url, _) = ui.serve(Backend(settings), app_parts(settings), prevent_thread_lock=True, quiet=True)
    try:
        assert httpx.get(f"{url}healthz", timeout=10).status_code == 200  # builds the middleware stack
        layers = _layers(demo.server_app)
        assert Edge in layers and BodyLimit in layers and LoginGuard not in layers, layers  # walked past the layers
        assert httpx.get(f"{url}metrics", timeout=10).status_code == 200  # nothing asks for a login
    finally:
        demo.close()


def test_the_guard_reads_no_more_of_a_body_than_the_core_would():
    """Outside the core's body limit, the guard reads at most --max-request-bytes (the limit refuses the rest)."""
    pulled, reached = [], []

    async def receive():
        pulled.append(1)
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}  # a chunked body without end

    async def app(scope, receive, send):  # the core's body limit and Gradio, inside
        reached.append(scope["path"])

    guard = LoginGuard(app, ("ada", "lovelace"), max_body=4096)
    for path, declared in (("/login", [(b"content-length", b"999999")]), ("/gradio_api/queue/join", []),
                           ("/login", [])):
        pulled.clear()
        scope = {"type": "http", "method": "POST", "path": path, "headers": declared, "client": ("127.0.0.1", 1),
                 "app": SimpleNamespace(tokens={}, cookie_id="c")}
        asyncio.run(guard(scope, receive, None))
        assert len(pulled) == (0 if declared else 5), path  # declared too large: unread; else cut past the limit
    assert reached == ["/login", "/gradio_api/queue/join", "/login"]


# ----- login backoff ----------------------------------------------------------------------------------------
def test_the_login_backoff_is_per_user_name_and_ignores_forged_forwarded_for(auth_app):
    url, throttle, demo = auth_app
    assert [_login(url, "guess", user="eve").status_code for _ in range(4)] == [400, 400, 400, 429]
    locked = _login(url, "guess", user="eve")
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    assert LoginGuard in _layers(demo.server_app)
    assert _login(url, "lovelace").status_code == 200  # another user name from the same address: not locked
    forged = [_login(url, "guess", user="eve", headers={"X-Forwarded-For": f"203.0.113.{n}"}).status_code
              for n in range(3)]
    assert forged == [429] * 3  # a new X-Forwarded-For from loopback is still the same client
    assert throttle.retry_after(("127.0.0.1", "eve")) > 0 and throttle.retry_after(ADA) == 0


@pytest.mark.slow
def test_a_login_token_expires_after_login_max_age(auth_app):
    url, _, demo = auth_app
    with httpx.Client() as client:
        assert _login(url, "lovelace", client).status_code == 200
        assert client.get(f"{url}gradio_api/info", timeout=10).status_code == 200
        assert len(demo.server_app.tokens) == 1
        time.sleep(3.7)  # --login-max-age 0.001 h: 3.6 s
        assert client.get(f"{url}gradio_api/info", timeout=10).status_code == 401
        assert demo.server_app.tokens == {}
        assert _login(url, "lovelace", client).status_code == 200  # logging in again works
        assert client.get(f"{url}gradio_api/info", timeout=10).status_code == 200


@pytest.mark.slow
def test_repeated_login_failures_get_refused_until_the_window_passes(tmp_path, demo_models):
    """20 wrong passwords from one client: after 5 each further try waits, doubling."""
    backend = warm_backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image")
    throttle = LoginThrottle(free_failures=5, base_delay_s=3.0, max_delay_s=6.0)  # 3 s: 14 requests fit
    demo, (_, url, _) = ui.serve(backend, login.plug(backend.settings, throttle), prevent_thread_lock=True,
                                 quiet=True)
    try:
        codes = [_login(url, f"wrong-{i}").status_code for i in range(20)]
        assert codes[:5] == [400] * 5  # wrong, but not yet slowed down
        assert codes[5] == 400 and set(codes[6:]) == {429}, codes  # the 6th failure starts the lock
        locked = _login(url, "lovelace")
        assert locked.status_code == 429 and "try again in" in locked.json()["detail"]  # even the right one
        assert int(locked.headers["retry-after"]) >= 1
        deadline = time.monotonic() + 10
        while throttle.retry_after(ADA) > 0:  # the lock's own clock, not a guessed sleep
            assert time.monotonic() < deadline
            time.sleep(throttle.retry_after(ADA))
        assert _login(url, "lovelace").status_code == 200  # after the window the right password works
        assert throttle.retry_after(ADA) == 0 and _login(url, "wrong").status_code == 400  # forgotten
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


# ----- job ownership ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_with_auth_only_the_login_that_started_a_job_can_cancel_it(tmp_path, demo_models):
    """Gradio 6.31's /gradio_api/cancel checks no login; the guard does."""
    backend = warm_backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image", "--context-length", "4096",
                           "--max-new-tokens", "4000")
    demo, (_, url, _) = ui.serve(backend, login.plug(backend.settings), prevent_thread_lock=True, quiet=True)
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
