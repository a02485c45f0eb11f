"""A stand-in for the ``neuronx-cc`` program: an executable script that only says which copy it is.

TorchNeuron runs the compiler it finds on ``PATH`` (``execvp("neuronx-cc")``), so what the tests need
of it is where it lies: a venv's ``bin/`` or another install's folder (docs/trainium.md).
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path


def write(folder: Path, hang_s: float | None = None, busy_s: float | None = None, until: Path | None = None) -> Path:
    """Write an executable ``neuronx-cc`` into ``folder`` (created); return its path.

    ``hang_s``: it then runs ``sleep`` for that long (a child of its own, as the real compiler's helpers
    are) instead of answering at once: a stuck compile, using no CPU. ``busy_s``: it computes for that long
    and exits 0: a long compile that makes progress. Then it is a Python script, as the real console script
    is (its command line reads ``python …/neuronx-cc``). ``until``: with ``busy_s``, it computes on past
    ``busy_s`` until that file exists (a test lets a run end only after the warm-up has looked at it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "neuronx-cc"
    if busy_s is not None:
        wait = f" or not os.path.exists({str(until)!r})" if until is not None else ""
        path.write_text(f"#!{sys.executable}\nimport os, time\nend = time.monotonic() + {busy_s}\n"
                        f"while time.monotonic() < end{wait}:\n    sum(range(1000))\n")
    else:
        body = f"sleep {hang_s}" if hang_s is not None else f"echo neuronx-cc at {path}"
        path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
