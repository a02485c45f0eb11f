"""The Neuron install as this process meets it before ``import torch``: whose compiler runs, and why a load failed.

``interpreter_bin_first`` puts the interpreter's folder first on ``PATH``; ``load_failure`` says which part of
the install a failed ``import torch`` points to, and its fix. Imports no torch. Why: docs/trainium.md.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("showcase.neuron_install")

COMPILER = "neuronx-cc"
WHEELS_OS = ("ubuntu", "26.04")  # the OS the Neuron 2.33 standalone torch-neuronx wheels support
WHEELS_OS_NAME = "Ubuntu 26.04"
NEURON_WORDS = ("Failed to load the backend extension", "torch_neuronx", "torch-neuronx", "libnrt")
GLIBC_MISSING = re.compile(r"GLIBC_(\d+(?:\.\d+)+)'? not found")
RUNTIME_MISSING = re.compile(r"libnrt\.so[.\d]*: cannot open shared object file")

RUNTIME_FIX = ("the Neuron runtime is not installed (libnrt.so.1 is missing): install the Neuron driver and "
               "runtime packages from the Neuron apt repository (aws-neuronx-dkms, aws-neuronx-runtime-lib), or "
               "start from the Neuron DLAMI, where they come preinstalled (docs/trainium.md)")
GLIBC_FIX = ("the torch-neuronx wheels need GLIBC_{needed}, newer than this host's {glibc}: the Neuron 2.33 "
             "wheels are built for " + WHEELS_OS_NAME + "'s glibc; run on " + WHEELS_OS_NAME + " (the TorchNeuron "
             "DLAMI; docs/trainium.md)")
MISMATCH_FIX = ("torch-neuronx must be the family of the installed torch: 2.13.3.1.* for torch 2.13.0 (what this "
                "app is tested with), 2.14.3.1.* for torch 2.14.0 (Neuron 2.34); fix it with "
                "pip install -r requirements-neuron.txt (docs/trainium.md)")


def interpreter_bin_first(environ: dict | None = None, executable: str | None = None) -> str | None:
    """Put the folder of this interpreter (a venv's ``bin/``) first on ``PATH``; call before ``import torch``.

    Returns the folder when ``PATH`` changed (logged then, so once per process), None when it was already
    first or the interpreter is unknown. ``environ`` defaults to ``os.environ``, ``executable`` to
    ``sys.executable`` (not resolved: a venv's python is a link to the base interpreter)."""
    env = os.environ if environ is None else environ
    exe = sys.executable if executable is None else executable
    if not exe:
        return None
    folder = os.path.dirname(os.path.abspath(exe))
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    if parts and parts[0] == folder:
        return None
    env["PATH"] = os.pathsep.join([folder, *(p for p in parts if p != folder)])
    log.info("put %s first on PATH: TorchNeuron runs the %s it finds there, and this folder holds this python's own",
             folder, COMPILER)
    return folder


@dataclass(frozen=True)
class LoadFailure:
    """Why torch-neuronx could not load: ``kind`` is "runtime", "glibc" or "mismatch"; ``fix`` says what to do."""

    kind: str
    cause: str  # the error's own text, with its cause
    fix: str


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def glibc_version() -> str:
    """This host's C library, e.g. "glibc 2.43" (``os.confstr``, else ``platform.libc_ver``)."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        found = None
    if found:
        return found
    name, version = platform.libc_ver()
    return f"{name} {version}".strip() or "an unknown C library"


def load_failure(exc: BaseException) -> LoadFailure | None:
    """What a failed load of torch-neuronx means, or None when ``exc`` is not about Neuron.

    torch wraps a failing autoload as ``RuntimeError("Failed to load the backend extension: ...")`` with
    the real error as its cause; an import of torch_neuronx itself can also fail with ``ImportError``
    (undefined symbol, a missing shared library, the PyPI placeholder)."""
    chain = _chain(exc)
    texts = [str(e) for e in chain]
    whole = " ".join(texts)
    if not any(word in whole for word in NEURON_WORDS):
        return None
    cause = texts[0] if exc.__cause__ is None else (f"{texts[0]} (caused by {type(exc.__cause__).__name__}: "
                                                    f"{exc.__cause__})")
    if RUNTIME_MISSING.search(whole):
        return LoadFailure("runtime", cause, RUNTIME_FIX)
    if glibc := GLIBC_MISSING.search(whole):
        return LoadFailure("glibc", cause, GLIBC_FIX.format(needed=glibc.group(1), glibc=glibc_version()))
    return LoadFailure("mismatch", cause, MISMATCH_FIX)


def os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    """The fields of ``/etc/os-release`` (``ID``, ``VERSION_ID``, ``PRETTY_NAME``, ...); empty when unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            fields[key.strip()] = value.strip().strip('"').strip("'")
    return fields
