"""Where compiled programs are cached. Imports no torch: ``app.py`` calls it before ``import torch``.

TorchNeuron reads ``TORCH_NEURONX_NEFF_CACHE_DIR`` (the NEFF cache, default ``neff_cache`` in the
system temp folder, wiped on reboot) and ``TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR`` (its folder of
compile lock files, default ``local_cache`` there) when its runtime's resource manager is first
built; ``init_process_group("neuron")`` builds it, and ``import torch`` autoloads torch-neuronx. So
both are set before either. ``devices`` re-exports these names.

An unwritable cache folder is not a reason to disable the NEFF cache: disabling it also bypasses
the in-process cache of the eager path, so every eager op would compile again on every call. The
caches go to a fresh temporary folder instead (lost at exit, but compiles are reused meanwhile).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .messages import tr

NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_LOCKS_ENV = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TEMP_PREFIX = "showcase-compile-cache-"


@dataclass(frozen=True)
class CacheSetup:
    """Where compiled programs are cached; ``problem`` says why that is a temporary folder."""

    folder: Path | None  # <cache root>/compile-cache, or None when it is not writable
    problem: str | None = None
    fallback: Path | None = None  # the temporary folder used instead


def _writable(folder: Path) -> OSError | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return exc
    return None


def configure_compile_cache(cache_root: Path, environ: dict | None = None) -> CacheSetup:
    """Point the NEFF cache, its lock folder and inductor's cache under ``cache_root``; call before torch.

    Layout: ``<root>/compile-cache/neff`` (NEFFs), ``<root>/compile-cache/inductor``, and the lock
    files in ``<root>/neff-locks`` (outside compile-cache: a cache bundle carries no locks).
    Idempotent. ``environ`` defaults to ``os.environ``.
    """
    env = os.environ if environ is None else environ
    root = Path(cache_root)
    folder = root / "compile-cache"
    problem = _writable(folder) or _writable(root / "neff-locks")
    if problem is not None:
        earlier = Path(env.get(NEFF_CACHE_ENV, "")).parent  # app.py called first: keep its temporary folder
        temp = earlier if earlier.name.startswith(TEMP_PREFIX) and earlier.is_dir() else Path(
            tempfile.mkdtemp(prefix=TEMP_PREFIX))
        _point(env, temp / "neff", temp / "neff-locks", temp / "inductor")
        return CacheSetup(None, tr("compile cache {folder} is not writable ({problem}); compiled programs are cached "
                                   "in {temp} for this run "
                                   "only (a restart compiles "
                                   "again)", folder=folder, problem=str(problem), temp=temp), temp)
    _point(env, folder / "neff", root / "neff-locks", folder / "inductor")
    return CacheSetup(folder)


def _point(env, neff: Path, locks: Path, inductor: Path) -> None:
    env[NEFF_CACHE_ENV] = str(neff)
    env[NEFF_LOCKS_ENV] = str(locks)
    env[INDUCTOR_CACHE_ENV] = str(inductor)
