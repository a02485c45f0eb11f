"""Launch the app in-process on the tiny models for API tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import ui
from app import PLUGINS
from neuron_backend.plugins import Parts, plug_all
from neuron_backend.runtime import Backend
from neuron_backend.settings import Settings, parse_settings
from tools.demo_models import plugin as demo_builder
from tools.demo_models.build import DEMO_DIR_NAME

SIZES = "64x64,96x64"
NO_EDITS = ("--references", "0")  # text-to-image only; a test that edits passes --references itself, later wins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_settings(argv, env=None, **kwargs) -> Settings:
    """The settings ``python app.py ARGV`` starts with: every plug-in's flags parsed too (no environment)."""
    return parse_settings(argv, env={} if env is None else env, plugins=PLUGINS, **kwargs)


def app_parts(settings: Settings) -> Parts:
    """What app.py's plug-ins add for ``settings``."""
    return plug_all(PLUGINS, settings)


def app_backend(settings: Settings, **kwargs) -> Backend:
    """The Backend app.py builds: with its plug-ins' parts."""
    return Backend(settings, parts=app_parts(settings), **kwargs)


def start_app(root, *extra, warm=True):
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--sizes", SIZES,
                               "--port", str(free_port()), "--max-new-tokens", "200",
                               "--chat-buckets", "32,64,128", "--context-length", "256", *NO_EDITS, *extra])
    backend = app_backend(settings)
    if warm:
        backend.runner.run()
    else:  # warm everything but the last image size: it stays queued (not ready)
        for step in backend.runner._steps[:-1]:
            backend.runner._run_step(step)
        backend.runner._steps[-1].task.expected_s = 30.0
    demo, (_, url, _) = ui.serve(backend, app_parts(settings), prevent_thread_lock=True, quiet=True)
    return demo, backend, url


def link_demo_models(root: Path, demo_models) -> None:
    """``root`` as a cache root whose demo models are the session's (a link: nothing is built again)."""
    (root / DEMO_DIR_NAME).parent.mkdir(parents=True, exist_ok=True)
    if not (root / DEMO_DIR_NAME).exists():
        (root / DEMO_DIR_NAME).symlink_to(demo_models.chat.parent, target_is_directory=True)


def run_fresh(script: str, *args: str) -> str:
    """Run ``script`` in a fresh interpreter (the repository and tests/ importable, from the repository root);
    its stdout, after asserting it exited 0 and printed "ok" last (else its stderr's end)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          cwd=root, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    return done.stdout


def warm_backend(root: Path, demo_models, *extra, plugins=()) -> Backend:
    """A warm backend on the tiny models under ``root`` (the session's demo models linked in), no page;
    ``plugins``: whose flags ``extra`` may give and whose parts it gets, after the demo models' builder."""
    link_demo_models(root, demo_models)
    plugins = (demo_builder, *plugins)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--sizes", SIZES,
                               "--port", str(free_port()), "--max-new-tokens", "200", *NO_EDITS, *extra], env={},
                              plugins=plugins)
    backend = Backend(settings, parts=plug_all(plugins, settings))
    backend.runner.run()
    return backend


@contextmanager
def slowed(engine, seconds: float = 0.02):
    """Each forward of the chat model takes ``seconds`` longer (a reply of 200 tokens lasts seconds)."""
    model, own = engine.model, "forward" in vars(engine.model)
    forward = model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    model.forward = slow_forward
    try:
        yield
    finally:
        if own:
            model.forward = forward
        else:
            del model.forward
