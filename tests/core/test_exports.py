"""The bounded folder of the files the page hands out: exports and images that were not saved."""

from __future__ import annotations

import os
import time

from PIL import Image

from neuron_backend.exports import ExportFolder


# ----- exports ------------------------------------------------------------------------------------
def test_export_folder_is_bounded_and_cleaned(tmp_path):
    """Exports no longer pile up in the temp dir."""
    folder = ExportFolder(tmp_path / "exports", limit=3, max_bytes=10_000)
    paths = [folder.write(f"export {i}", ".md", "conversation") for i in range(5)]
    assert [p.read_text() for p in folder.files()] == ["export 2", "export 3", "export 4"]
    assert paths[-1].name.startswith("conversation-") and paths[-1].suffix == ".md"
    big = folder.write(b"x" * 9_000, ".bin")
    assert folder.files()[-1] == big and sum(p.stat().st_size for p in folder.files()) <= 10_000
    png = folder.write_png(Image.new("RGB", (8, 8)))
    assert Image.open(png).size == (8, 8)
    old = tmp_path / "exports" / "conversation-old.md"
    old.write_text("left by an earlier run")
    stale = time.time() - 3 * 24 * 3600
    os.utime(old, (stale, stale))
    ExportFolder(tmp_path / "exports", max_age_s=24 * 3600)  # a new start removes it
    assert not old.exists() and png.exists()
