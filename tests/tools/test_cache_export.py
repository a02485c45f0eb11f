"""Operator actions: the compile-cache export is offered only under --auth (a logged-in user), goes
through the bounded exports folder, and a second press with an unchanged cache reuses the first file.
The page's own Export event is driven over HTTP on 127.0.0.1."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from support.app import SIZES, app_backend, app_parts, app_settings, free_port, link_demo_models

import ui
from neuron_backend.errors import CacheBundleError, ShowcaseError
from neuron_backend.exports import ExportFolder
from neuron_backend.runtime import Backend
from tools.cache import bundle, warm_start
from tools.cache.panel import press_export_bundle
from ui.i18n import say, text_id
from ui.status_panel import details_markdown

FAKE_CACHE = {"neff/MODULE_1/model.neff": b"\x01neff" * 100, "inductor/fxgraph/ab/entry": b"graph"}


def _backend(root: Path, demo_models, *extra: str) -> Backend:
    """A backend on the tiny models whose weights are found (the manifest needs them) and a small cache."""
    link_demo_models(root, demo_models)
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root), "--sizes", SIZES,
                             "--port", str(free_port()), *extra])
    backend = app_backend(settings)
    for step in backend.runner._steps:
        if step.task.kind == "weights":
            backend.runner._run_step(step)
    for rel, data in FAKE_CACHE.items():
        path = root / "compile-cache" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return backend


def _export_event(demo) -> int | None:
    """The index of the event that fills the bundle file box (the Export button's), or None."""
    for index, fn in demo.fns.items():
        if any(getattr(block, "elem_id", None) == "bundle-file" for block in fn.outputs):
            return index
    return None


def _elem_ids(demo) -> set:
    return {getattr(block, "elem_id", None) for block in demo.blocks.values()}


@pytest.mark.slow
def test_anonymous_visitors_are_not_offered_the_cache_export(tmp_path, demo_models):
    backend = _backend(tmp_path, demo_models)
    demo = ui.create_demo(backend, details=app_parts(backend.settings).details)
    assert _export_event(demo) is None and "export-bundle" not in _elem_ids(demo)
    note = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "export-bundle-note")
    assert text_id("Exporting the compile cache is an operator action: it is offered to a logged-in user when the app "
                   "runs with `--auth`. On the server: `python -m tools.cache export OUT.tar.gz`.") in str(note.value)
    assert "--auth" in say("Exporting the compile cache is an operator action: it is offered to a logged-in user when "
                           "the app runs with `--auth`. On the server: `python -m "
                           "tools.cache export OUT.tar.gz`.") and "tools.cache export" in say(
        "Exporting the compile cache is an operator action: it is offered to a logged-in user when the app runs with "
        "`--auth`. On the server: `python -m tools.cache export OUT.tar.gz`.")
    with pytest.raises(Exception, match="--auth"):  # the handler itself refuses too
        press_export_bundle(backend)(None)
    status = backend.status()
    assert str(tmp_path) not in details_markdown(status, show_paths=False)  # no server path for anonymous visitors
    assert not (tmp_path / "exports").exists() or not list((tmp_path / "exports").iterdir())


@pytest.mark.slow
def test_with_auth_two_presses_make_one_file(tmp_path, demo_models):
    backend = _backend(tmp_path, demo_models, "--auth", "ada:lovelace", "--no-image")
    demo, (_, url, _) = ui.serve(backend, app_parts(backend.settings), prevent_thread_lock=True, quiet=True)
    try:
        index = _export_event(demo)
        assert index is not None
        with httpx.Client(timeout=60) as client:
            body = {"fn_index": index, "data": [], "session_hash": "operator"}
            assert client.post(url + "gradio_api/run/predict", json=body).status_code == 401  # not logged in
            assert client.post(url + "login", data={"username": "ada", "password": "lovelace"}).status_code == 200
            answers = []
            for _ in range(2):
                answers.append(client.post(url + "gradio_api/run/predict", json=body))
                time.sleep(1.1)  # a name stamped to the second would differ on the second press
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        exported = [p for p in backend.exports.files() if p.name.startswith("compile-cache")]
        assert len(exported) == 1, exported
        assert [a.json()["data"][0]["orig_name"] for a in answers] == [exported[0].name] * 2
        assert answers[0].json()["data"][0]["path"] == answers[1].json()["data"][0]["path"]  # one Gradio copy
        (tmp_path / "compile-cache" / "neff" / "MODULE_2.neff").write_bytes(b"new graph")  # a changed cache
        time.sleep(0.01)
        assert warm_start.of(backend).export() not in exported
        assert len([p for p in backend.exports.files() if p.name.startswith("compile-cache")]) == 2
    finally:
        demo.close()


def test_cache_exports_keep_the_exports_folder_bound(tmp_path, demo_models):
    backend = _backend(tmp_path, demo_models, "--auth", "ada:lovelace")
    first = warm_start.of(backend).export()
    size = first.stat().st_size
    backend.exports = ExportFolder(tmp_path / "exports", max_bytes=size + 1_000)  # room for one bundle
    (tmp_path / "compile-cache" / "inductor" / "more").write_bytes(b"a" * 500)  # compresses well
    second = warm_start.of(backend).export()
    assert second != first and backend.exports.files() == [second]  # the older one pruned to keep the bound
    (tmp_path / "compile-cache" / "inductor" / "noise").write_bytes(os.urandom(4 * size))
    with pytest.raises(CacheBundleError, match=f"more than {size + 1_000} bytes"):
        warm_start.of(backend).export()
    assert backend.exports.files() == [second]
    assert [p.name for p in (tmp_path / "exports").iterdir()] == [second.name]  # no temporary file left
    assert sum(p.stat().st_size for p in backend.exports.files()) <= backend.exports.max_bytes
    assert isinstance(CacheBundleError("x"), ShowcaseError)


def test_the_cli_export_has_no_folder_bound(tmp_path, demo_models):
    backend = _backend(tmp_path, demo_models)
    warm_start.of(backend).record()
    out = tmp_path / "elsewhere" / "bundle.tar.gz"
    described = bundle.export(tmp_path, out)
    assert out.is_file() and set(FAKE_CACHE) <= set(described["files"])
