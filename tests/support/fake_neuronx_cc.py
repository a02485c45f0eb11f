"""A stand-in for the ``neuronx-cc`` program: an executable script that only says which copy it is.

TorchNeuron runs the compiler it finds on ``PATH`` (``execvp("neuronx-cc")``), so what the tests need
of it is where it lies: a venv's ``bin/`` or another install's folder (docs/trainium.md).
"""

from __future__ import annotations

import stat
from pathlib import Path


def write(folder: Path) -> Path:
    """Write an executable ``neuronx-cc`` into ``folder`` (created); return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "neuronx-cc"
    path.write_text(f"#!/bin/sh\necho neuronx-cc at {path}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
