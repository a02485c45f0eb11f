"""The bounded folder of the files the page hands out: exports and images that were not saved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from PIL import Image

from neuron_backend.exports import STALE_TMP_S, ExportFolder

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_killed_export_leaves_no_temporary_file_for_long(tmp_path):
    """An export killed mid-write leaves its .tmp files; the next start (and every write) removes them once
    nobody has written to them for STALE_TMP_S, and never a write still in progress."""
    folder = tmp_path / "exports"
    killed = textwrap.dedent(f"""
        import os, signal
        from neuron_backend.exports import ExportFolder

        def produce(tmp, limit):  # as bundle.export: its own <tmp>.tmp, renamed to tmp when done
            tmp.with_name(tmp.name + ".tmp").write_bytes(b"half an archive")
            os.kill(os.getpid(), signal.SIGKILL)

        ExportFolder({str(folder)!r}).write_keyed("abc", ".tar.gz", "compile-cache", produce)
    """)
    done = subprocess.run([sys.executable, "-c", killed], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    [leftover] = list(folder.iterdir())
    assert leftover.name.startswith(".tmp-") and leftover.name.endswith(".tmp")
    live = folder / ".tmp-another-write-in-progress"
    live.write_bytes(b"being written")
    ExportFolder(folder).write("x", ".md")
    assert leftover.exists()  # recent: it might still be written by another process
    stale = time.time() - STALE_TMP_S - 60
    os.utime(leftover, (stale, stale))
    ExportFolder(folder)  # the next start
    assert not leftover.exists() and live.exists()
    os.utime(live, (stale, stale))
    ExportFolder(folder, max_age_s=24 * 3600).write("y", ".md")  # on a write too
    assert not live.exists() and not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]
