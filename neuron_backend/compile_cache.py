"""Where compiled programs are cached. Imports no torch: ``app.py`` calls it before ``import torch``.

TorchNeuron reads ``TORCH_NEURONX_NEFF_CACHE_DIR`` (the NEFF cache, default ``neff_cache`` in the
system temp folder, wiped on reboot) and ``TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR`` (its folder of
compile lock files, default ``local_cache`` there) when its runtime's resource manager is first
built; ``init_process_group("neuron")`` builds it, and ``import torch`` autoloads torch-neuronx. So
both are set before either. ``TORCH_NEURONX_HLO_CACHE_DIR`` and ``NKI_TRACE_CACHE_URL`` (a folder
path) are read at import too, so they are set at the same time. ``devices`` re-exports these names.

A value the user exported before the app started is kept (NEFF, HLO and NKI trace caches) and said
in the log and in /status; the app tells its own values from such a preset one by the record it
leaves in ``SHOWCASE_COMPILE_CACHE_SET`` (``app.py`` configures, then ``Backend`` again; a child
process inherits both).

Lock files belong on local disk: on a network filesystem (NFS, EFS, FSx for Lustre: the fs type of
the cache root's mount in ``/proc/mounts``) the lock folder goes to the user's local cache folder or
the temp folder instead.

An unwritable cache folder is not a reason to disable the NEFF cache: disabling it also bypasses
the in-process cache of the eager path, so every eager op would compile again on every call. The
caches go to a fresh temporary folder instead (lost at exit, but compiles are reused meanwhile).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .messages import tr

NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_LOCKS_ENV = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
HLO_CACHE_ENV = "TORCH_NEURONX_HLO_CACHE_DIR"
NKI_TRACE_ENV = "NKI_TRACE_CACHE_URL"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
KEPT_IF_PRESET = (NEFF_CACHE_ENV, HLO_CACHE_ENV, NKI_TRACE_ENV)
SET_BY_APP_ENV = "SHOWCASE_COMPILE_CACHE_SET"  # JSON: the values this app wrote, by variable
TEMP_PREFIX = "showcase-compile-cache-"
# Mount types whose lock files are not local: EFS and NFS-served FSx mount as nfs4/nfs, FSx for Lustre as lustre.
NETWORK_FILESYSTEMS = {"nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "fuse.glusterfs"}
PROC_MOUNTS = Path("/proc/mounts")


@dataclass(frozen=True)
class CacheSetup:
    """Where compiled programs are cached; ``problem`` says why that is a temporary folder.

    ``notes`` say what differs from the usual layout (a preset cache kept, locks moved to local disk),
    without server paths (/status shows them to anonymous visitors); ``paths`` holds every folder chosen,
    by variable, for the log."""

    folder: Path | None  # <cache root>/compile-cache, or None when it is not writable
    problem: str | None = None
    fallback: Path | None = None  # the temporary folder used instead
    notes: tuple[str, ...] = ()
    paths: tuple[tuple[str, str], ...] = ()


def _writable(folder: Path) -> OSError | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return exc
    return None


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem that holds ``path``: the longest mount point above it in ``mounts``
    (the text of ``/proc/mounts``, read when None); None where that cannot be told."""
    if mounts is None:
        try:
            mounts = PROC_MOUNTS.read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    best, kind = None, None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # "\040" is a space
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best)):
            best, kind = point, fields[2]
    return kind


def on_network_filesystem(path: Path, mounts: str | None = None) -> str | None:
    """The network filesystem type ``path`` lies on (e.g. "nfs4"), or None for local disk or unknown."""
    kind = filesystem_type(path, mounts)
    return kind if kind in NETWORK_FILESYSTEMS else None


def _local_locks(env, mounts: str | None) -> Path:
    """A lock folder on local disk: the user's cache folder, else the temp folder (per user)."""
    home = env.get("HOME") or str(Path.home())
    candidates = [Path(env.get("XDG_CACHE_HOME") or Path(home) / ".cache") / "showcase" / "neff-locks",
                  Path(tempfile.gettempdir()) / f"showcase-neff-locks-{os.getuid() if hasattr(os, 'getuid') else 0}"]
    for folder in candidates:
        if not on_network_filesystem(folder, mounts) and _writable(folder) is None:
            return folder
    return candidates[-1]


def _set_by_app(env) -> dict[str, str]:
    try:
        recorded = json.loads(env.get(SET_BY_APP_ENV) or "{}")
    except ValueError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


def compile_cache_folder(env=None) -> Path | None:
    """The ``compile-cache`` folder this process's app pointed the caches into (a temp folder when the cache
    root was not writable); None before the app configured them."""
    inductor = _set_by_app(os.environ if env is None else env).get(INDUCTOR_CACHE_ENV)
    return Path(inductor).parent if inductor else None


def preset(env) -> dict[str, str]:
    """The cache variables among ``KEPT_IF_PRESET`` that were set before the app, by someone else."""
    ours = _set_by_app(env)
    return {name: env[name] for name in KEPT_IF_PRESET if env.get(name) and env[name] != ours.get(name)}


def configure_compile_cache(cache_root: Path, environ: dict | None = None, mounts: str | None = None) -> CacheSetup:
    """Point the compile caches and the lock folder under ``cache_root``; call before torch.

    Layout: ``<root>/compile-cache/{neff,hlo,nki-trace,inductor}`` (what a bundle carries) and the lock
    files in ``<root>/neff-locks`` (outside compile-cache: a cache bundle carries no locks), or on local
    disk when the root is on a network filesystem. A NEFF, HLO or NKI trace folder set before the app
    started is kept. Idempotent. ``environ`` defaults to ``os.environ``; ``mounts`` (the text of
    ``/proc/mounts``) is read when None.
    """
    env = os.environ if environ is None else environ
    kept = preset(env)
    root = Path(cache_root)
    folder = root / "compile-cache"
    network = on_network_filesystem(root, mounts)
    locks = _local_locks(env, mounts) if network else root / "neff-locks"
    problem = _writable(folder) or _writable(locks)
    notes = [tr("{variable} was set before the app started: its folder is used for that cache, and compile-cache "
                "bundles neither carry nor fill it", variable=name) for name in kept]
    if network:
        notes.append(tr("the cache root is on a network filesystem ({kind}): compile lock files are kept on local "
                        "disk", kind=network))
    if problem is not None:
        earlier = Path(_set_by_app(env).get(INDUCTOR_CACHE_ENV, "")).parent  # app.py called first: keep its folder
        temp = earlier if earlier.name.startswith(TEMP_PREFIX) and earlier.is_dir() else Path(
            tempfile.mkdtemp(prefix=TEMP_PREFIX))
        paths = _point(env, temp, temp / "neff-locks", kept)
        return CacheSetup(None, tr("compile cache {folder} is not writable ({problem}); compiled programs are cached "
                                   "in {temp} for this run "
                                   "only (a restart compiles "
                                   "again)", folder=folder, problem=str(problem), temp=temp), temp,
                          tuple(notes), paths)
    return CacheSetup(folder, notes=tuple(notes), paths=_point(env, folder, locks, kept))


def _point(env, folder: Path, locks: Path, kept: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Set every cache variable but the preset ones; record what was set; return every folder, by variable."""
    chosen = {NEFF_CACHE_ENV: folder / "neff", HLO_CACHE_ENV: folder / "hlo", NKI_TRACE_ENV: folder / "nki-trace",
              INDUCTOR_CACHE_ENV: folder / "inductor", NEFF_LOCKS_ENV: locks}
    ours = {name: str(path) for name, path in chosen.items() if name not in kept}
    env.update(ours)
    env[SET_BY_APP_ENV] = json.dumps(ours, sort_keys=True)
    return tuple((name, kept.get(name) or ours[name]) for name in chosen)
