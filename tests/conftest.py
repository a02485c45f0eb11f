"""Shared fixtures: every cache path goes to a temp folder; tiny demo models built once."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import torch
from support.cache_env import COMPILE_CACHE_VARIABLES

# On 2 cores another busy process otherwise slows the tiny models tenfold.
torch.set_num_threads(1)
# Keep inductor's cache out of the user's home; one folder for the session so repeated
# compiles of the same graph across tests are cache hits.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="showcase-inductor-"))
os.environ["HF_HUB_OFFLINE"] = "1"
# Gradio's folder for this test process, as app.py gives each server its own (ui.own_gradio_folder):
# Gradio files an upload under its bytes' hash and deletes what it filed when its app closes, so the
# other worker's app closing deleted a reference picture this worker's app had just been sent. The
# apps this process starts with app.py file theirs under it, in port-<port>.
GRADIO_FOLDER = os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix="showcase-gradio-")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(GRADIO_FOLDER, ignore_errors=True)


TESTS = Path(__file__).parent
# The modules whose tests take longest on 2 cores (compiles, long prompts, several apps), longest first. They run
# first, after the browser group: under pytest-xdist's --dist loadgroup each worker takes the next test in this
# order, so one worker plays the browser group while the other goes through these, and the run ends on short
# tests, not on one worker left alone with a two-minute test while the other idles. Whole modules move, in their
# own order, so a module-scoped fixture is still built once per worker.
LONGEST_FIRST = ("core/test_prefill_parity.py", "core/test_image_edit.py", "core/test_prefill.py",
                 "core/test_warmup.py", "core/test_image.py", "tools/test_cache_bundle.py", "core/test_chat.py",
                 "tools/test_first_device_check.py", "tools/test_parallel.py", "tools/test_aot.py",
                 "ui/test_gradio_folder.py")


def _run_order(item) -> int:
    path = Path(item.fspath).relative_to(TESTS).as_posix()
    if path.startswith("browser/"):
        return -1
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items):
    items.sort(key=_run_order)  # stable: the rest keep the order they were collected in


# Text-to-image only ("--references 0"): the edit tests ask for their reference slots themselves.
SMALL_SHAPES = ("--chat-buckets", "32,64,128", "--context-length", "256", "--references", "0")


@pytest.fixture(scope="session")
def session_root(tmp_path_factory):
    """A cache root shared by the whole test session (demo models live here)."""
    return tmp_path_factory.mktemp("cache-root")


@pytest.fixture(scope="session")
def demo_models(session_root):
    """The tiny chat model and image pipeline, built once per session."""
    from tools.demo_models.build import ensure_demo_models

    return ensure_demo_models(session_root)


@pytest.fixture(scope="session")
def real_size_models(tmp_path_factory):
    """FLUX.2-klein-4B and Qwen3-0.6B folders with the real configs and weight headers, no weights (real_size.py)."""
    from types import SimpleNamespace

    from support import real_size

    root = tmp_path_factory.mktemp("real-size")
    return SimpleNamespace(image=real_size.flux2_klein_4b(root / "FLUX.2-klein-4B"),
                           chat=real_size.qwen3_0_6b(root / "Qwen3-0.6B"))


@pytest.fixture
def tiny_settings(tmp_path, session_root):
    """Settings for the demo models on CPU with a per-test cache root."""
    from neuron_backend.settings import parse_settings

    # The engine tests' small shapes (the demo preset's are larger: a pasted paragraph must fit there); this
    # installation's own files (a signing key) under the session's root, not the user's home
    return parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), *SMALL_SHAPES],
                          env={"XDG_CONFIG_HOME": str(session_root / "config")})


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF_HUB_CACHE, offline; a test that wants a Hub points ENDPOINT at a local stand-in."""
    import huggingface_hub

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def neuron_ls(tmp_path, monkeypatch):
    """Put a fake ``neuron-ls`` first on ``PATH``: ``neuron_ls("2.34")``, ``neuron_ls("2.33", devices=16)``, ...

    A real executable in the form of a Neuron release (tests/support/fake_neuron_ls.py); returns its path."""
    from support import fake_neuron_ls

    def put(form: str, **kwargs):
        return fake_neuron_ls.put_on_path(monkeypatch, tmp_path / "neuron-tools", form, **kwargs)

    return put


@pytest.fixture(scope="session")
def warm_app(tmp_path_factory):
    """One app on the tiny models, warmed up, for every test that only needs one running: (backend, url).

    In-process (tests/support/app.py: the settings of ``start_app``); closed when the session ends."""
    from support.app import start_app

    demo, backend, url = start_app(tmp_path_factory.mktemp("warm-app"))
    yield backend, url
    demo.close()


@pytest.fixture
def home_root():
    """A cache root outside both the working directory and the temp dir (as the default ~/.cache is)."""
    root = Path.home() / f".showcase-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def compile_cache_environment():
    """Each test leaves the compile-cache variables as it found them. A Backend built in a test points them
    at its tmp folder in ``os.environ`` (as the app does, once, at start); a test's monkeypatch restoring one
    of them without the app's record of what it set would make a later app take the leftover folder for a
    cache its user set on purpose (and keep it)."""
    saved = {name: os.environ.get(name) for name in COMPILE_CACHE_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
