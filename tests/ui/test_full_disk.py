"""A full or read-only cache root (``--cache-dir``): images still reach their visitor, with a note that says
they were not saved and what to do; no Python errno text and no server path anywhere a visitor reads;
the next image after space returns is saved.

The disk is faked at the write boundary: ``open`` (Pillow's ``Image.save``, ``Path.write_bytes``) raises
``OSError(ENOSPC)`` or ``OSError(EROFS)`` for any file under the cache root. A real read-only folder
(``chmod``) is tried too where it blocks writes (not for root).
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import io
import json
import os
import stat
from pathlib import Path

import pytest
from PIL import Image
from support.app import warm_backend

import ui
from neuron_backend.errors import StorageError
from neuron_backend.exports import ExportFolder
from neuron_backend.image.engine import ImageRequest
from neuron_backend.image.png_info import OutputFolder
from ui import i18n
from ui.api import ImageRun
from ui.image_tab import params_view

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402

DISKS = {errno.ENOSPC: ("No space left on device", "full"), errno.EROFS: ("Read-only file system", "read-only")}
PYTHON_WORDS = ("Errno", "No space left", "Read-only file system", "Traceback", "OSError")


class FakeDisk:
    """While ``broken`` is an errno, every file opened for writing under ``root`` fails with it."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.broken = str(Path(root).resolve()), None
        real_open = builtins.open

        def open_(file, mode="r", *args, **kwargs):
            if self.broken and isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
                if str(Path(file).resolve()).startswith(self.root):
                    raise OSError(self.broken, DISKS[self.broken][0], str(file))
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(io, "open", open_)  # pathlib's Path.open (write_bytes, write_text)


def _clear(text: str, root: Path) -> None:
    """``text`` (what a visitor reads) names no Python error and no server path."""
    for word in PYTHON_WORDS:
        assert word not in text, text
    assert str(root) not in text, text


def _image(seed: int) -> Image.Image:
    return Image.new("RGB", (8, 8), (seed, 0, 0))


# ----- the folders ----------------------------------------------------------------------------------
@pytest.mark.parametrize("code", sorted(DISKS))
def test_a_full_or_read_only_disk_gives_a_clear_note_and_the_next_save_works(tmp_path, monkeypatch, code):
    disk = FakeDisk(tmp_path, monkeypatch)
    outputs, exports = OutputFolder(tmp_path / "outputs", 5), ExportFolder(tmp_path / "exports")
    disk.broken = code
    problem = outputs.save(_image(1), {"seed": 1}, stem="x").problem
    assert problem.startswith("not saved: could not write to") and DISKS[code][1] in problem
    assert "--cache-dir" in problem and "download it" in problem
    with pytest.raises(StorageError) as refused:
        exports.write(b"png", ".png", "image")
    assert isinstance(refused.value, OSError) and "--cache-dir" in str(refused.value)
    with i18n.speaking("ar"):
        texts = [i18n.localized(problem), i18n.localized(refused.value)]
    for text in (problem, str(refused.value), *texts):
        _clear(text, tmp_path)
    assert texts[0] != problem  # the page's Arabic reads it in Arabic
    assert not [p for p in (tmp_path / "outputs").iterdir()]  # no half-written PNG left behind
    disk.broken = None  # space returns: the next image is saved, the next export written
    saved = outputs.save(_image(2), {"seed": 2}, stem="y")
    assert saved.problem is None and saved.path.is_file()
    assert exports.write(b"png", ".png", "image").is_file()


# ----- the Image tab and /generate_image ------------------------------------------------------------
@pytest.fixture(scope="module")
def app_on_a_home_root(tmp_path_factory, demo_models):
    """An app whose cache root is outside the working directory and the temp dir (as ~/.cache is)."""
    import shutil
    import uuid

    root = Path.home() / f".showcase-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    backend = warm_backend(root, demo_models, "--no-chat")
    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)
    yield backend, url, root
    demo.close()
    for folder in (root / "outputs", root / "exports"):
        if folder.exists():
            folder.chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)


def _delivered(path: str, seed: int) -> dict:
    with Image.open(path) as png:
        assert png.size == (64, 64)
        saved = json.loads(png.text["showcase"])  # the PNG carries its parameters, saved or not
    assert saved["seed"] == seed
    return saved


@pytest.mark.slow
@pytest.mark.parametrize("code", sorted(DISKS))
def test_images_reach_the_visitor_from_a_full_or_read_only_cache_root(app_on_a_home_root, monkeypatch, code):
    backend, url, root = app_on_a_home_root
    disk = FakeDisk(root, monkeypatch)
    client = Client(url, verbose=False)
    disk.broken = code
    path, params = client.predict("a lighthouse", seed=11, api_name="/generate_image")
    _delivered(path, 11)
    note = params["save_note"]
    assert note.startswith("not saved") and DISKS[code][1] in note and "--cache-dir" in note
    _clear(json.dumps(params), root)
    # The Image tab's run: the same file handed out, its note in the page's language.
    run = ImageRun(backend, ImageRequest("a lighthouse", "64x64", steps=1, seed=12), preview=False)
    [(tab_path, tab_params)] = asyncio.run(run.finished())
    _delivered(tab_path, 12)
    assert not tab_path.startswith(str(root))  # nothing under the cache root could be written
    with i18n.speaking("ar"):
        _clear(json.dumps(params_view(tab_params), ensure_ascii=False), root)
    disk.broken = None  # space returns: the next image is saved under the cache root, no note
    path, params = client.predict("a lighthouse", seed=13, api_name="/generate_image")
    assert "save_note" not in params and Path(path).name == backend.engine("image").outputs.saved_files()[-1].name


@pytest.mark.slow
def test_a_really_read_only_cache_root_still_delivers(app_on_a_home_root):
    """``chmod`` the images and exports folders read-only (skipped where that does not block writes: root)."""
    backend, url, root = app_on_a_home_root
    folders = [root / "outputs", root / "exports"]
    for folder in folders:
        folder.mkdir(exist_ok=True)
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        probe = folders[0] / "probe"
        try:
            probe.write_bytes(b"")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("chmod does not block writes for this user (root): the faked disk covers it")
        path, params = Client(url, verbose=False).predict("a lighthouse", seed=21, api_name="/generate_image")
        _delivered(path, 21)
        assert params["save_note"].startswith("not saved") and "--cache-dir" in params["save_note"]
        _clear(json.dumps(params), root)
    finally:
        for folder in folders:
            folder.chmod(0o755)
