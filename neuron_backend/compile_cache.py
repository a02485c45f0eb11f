"""Where compiled programs are cached, and how many were compiled (``CompileCounter``). Imports no torch:
``app.py`` calls it before ``import torch``; ``devices`` re-exports its variable names.

``configure_compile_cache`` sets TorchNeuron's NEFF, lock, HLO and NKI trace folders (and inductor's) under
the cache root before torch-neuronx reads them. Why each: docs/trainium.md, "Cache folders set in time".
"""

from __future__ import annotations

import json
import os
import re
import sys
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
    """Point the compile caches under ``<cache_root>/compile-cache/{neff,hlo,nki-trace,inductor}`` and the lock
    files under ``<cache_root>/neff-locks`` (or local disk); call before torch. Idempotent. ``environ``
    defaults to ``os.environ``; ``mounts`` (the text of ``/proc/mounts``) is read when None.
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


# ----- compile counters ---------------------------------------------------------------------------------------
# Compile counters (TorchNeuron's own on Neuron, dynamo's elsewhere) and the panel's device counters; which
# counts what: docs/trainium.md, "Honest counters". ``torch.neuron.get_dynamo_metrics()`` is never read: it
# synchronises, and the panel polls while requests run.
NEURON_COMPILES = "CompilationCache.TotalCompilations"
NEURON_HITS = "CompilationCache.PersistentHits"
NEURON_MISSES = "CompilationCache.PersistentMisses"

SOURCES = {  # in words, as messages (the page shows them in its language)
    "neuron-metrics": tr("TorchNeuron metrics: NEFFs compiled or read from the NEFF cache (eager ops and graphs)"),
    "neuron-graphs": tr("TorchNeuron compiled graphs (torch.compile only; eager per-op compiles are not counted: "
                        "metrics unavailable)"),
    "dynamo": tr("dynamo graphs and inductor's cache (CPU/CUDA stand-in for Neuron compiles)"),
}


def _metrics():
    """``torch_neuronx.metrics`` when torch-neuronx is loaded and collects metrics, else None."""
    if "torch_neuronx" not in sys.modules:
        return None
    try:
        from torch_neuronx import metrics
    except ImportError:
        return None
    try:
        if not metrics.is_enabled():  # collection is off by default (TORCH_NEURONX_METRICS_ENABLED)
            metrics.set_enabled(True)
        return metrics if metrics.is_enabled() else None
    except Exception:  # noqa: BLE001 - a metrics API that fails is treated as missing
        return None


class CompileCounter:
    """Counts compiles process-wide: TorchNeuron's counters once ``torch.neuron`` is registered, else dynamo's.

    The counters are process-wide, so a delta taken around a request also sees compiles made by
    another engine at the same time; the warm-up status uses it as a recompile alarm.
    """

    mode = "auto"  # "auto": neuron when torch.neuron exists; "neuron" / "dynamo" force one

    @classmethod
    def source(cls) -> str:
        """What ``graphs()`` and ``cache_hits()`` count, in words (the panel shows it)."""
        return SOURCES[cls._effective()]

    @classmethod
    def _effective(cls) -> str:
        if cls.mode == "dynamo" or (cls.mode == "auto" and getattr(sys.modules.get("torch"), "neuron", None) is None):
            return "dynamo"
        return "neuron-metrics" if _metrics() is not None else "neuron-graphs"

    @classmethod
    def graphs(cls) -> int:
        """New compiled programs so far in this process: NEFFs compiled or read from the cache on Neuron."""
        from torch._dynamo.utils import counters

        mode = cls._effective()
        if mode == "neuron-metrics":
            metrics = _metrics()
            return int(metrics.get_counter_value(NEURON_COMPILES) or 0) + int(metrics.get_counter_value(NEURON_HITS)
                                                                              or 0)
        if mode == "neuron-graphs":
            return int(counters["neuron"]["compiled_graphs"])
        return int(counters["stats"]["unique_graphs"])

    @classmethod
    def cache_hits(cls) -> tuple[int, int]:
        """(hits, misses) of the on-disk compiled-program cache so far; (0, 0) where it is not counted."""
        from torch._dynamo.utils import counters

        mode = cls._effective()
        if mode == "neuron-metrics":
            metrics = _metrics()
            return int(metrics.get_counter_value(NEURON_HITS) or 0), int(metrics.get_counter_value(NEURON_MISSES) or 0)
        if mode == "neuron-graphs":
            return 0, 0
        return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])


    @staticmethod
    def loaded() -> int:
        """Compiled programs loaded whole so far (each counted by a ``Parts.compiled`` wrapper in dynamo's
        ``counters["showcase"]["aot_loaded"]``): no trace and no compile, a cache hit."""
        from torch._dynamo.utils import counters

        return int(counters["showcase"]["aot_loaded"])


def use_neuron_counters() -> str:
    """Count with TorchNeuron's metrics from now on (enabling their collection); return the source text."""
    CompileCounter.mode = "neuron"
    if "torch_neuronx" in sys.modules:
        try:
            from torch_neuronx import metrics

            metrics.set_enabled(True)
        except Exception:  # noqa: BLE001 - older releases: fall back to the graph counter, said in source()
            pass
    return CompileCounter.source()


def device_counters(placements: dict) -> dict:
    """Plain data for the panel: which compile counter is shown, memory per core, ops that fell back to CPU.

    Reads only allocator statistics and TorchNeuron's op tracking (no synchronize): safe from a UI poll.
    """
    import torch

    out: dict = {"compile_counter": CompileCounter.source(), "memory": {}, "cpu_fallback_ops": None}
    # the total by the runtime's own index of the core (Placement.runtime_core), the allocated bytes by PyTorch's
    cores = sorted({(p.kind, p.core, p.runtime_core) for p in placements.values() if p.kind in ("neuron", "cuda")})
    for kind, core, runtime_core in cores:
        module = torch.neuron if kind == "neuron" else torch.cuda
        try:
            used = int(module.memory_allocated(core))
            total = int(module.get_device_properties(runtime_core if kind == "neuron" else core).total_memory)
        except Exception as exc:  # noqa: BLE001 - an API this release lacks is reported, not fatal
            out["memory"][f"{kind}:{core}"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        out["memory"][f"{kind}:{core}"] = {"allocated_bytes": used, "total_bytes": total}
    neuronx = sys.modules.get("torch_neuronx")
    if neuronx is not None and hasattr(neuronx, "get_fallback_ops"):
        try:
            out["cpu_fallback_ops"] = sorted(set(neuronx.get_fallback_ops()))
        except Exception:  # noqa: BLE001 - op tracking unavailable: shown as unknown
            out["cpu_fallback_ops"] = None
    return out
