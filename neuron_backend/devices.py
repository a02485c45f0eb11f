"""Every difference between neuron, cuda and cpu lives here; engines ask, they do not branch.

Neuron quirks handled here (NOTES.md section 1-2):
- ``device_map="auto"`` does not see Neuron and silently loads on CPU, so placement is always an
  explicit device string.
- ``torch.compile`` uses the ``"neuron"`` backend on Neuron, inductor elsewhere.
- generate() inputs stay on CPU on Neuron (generate moves only the per-step forward inputs).
- compiled programs (NEFFs) go to ``TORCH_NEURONX_NEFF_CACHE_DIR``, which defaults to a /tmp
  folder wiped on reboot; we point it (and inductor's cache) at the persistent cache root.
- the PyPI ``torch-neuronx`` is a placeholder whose import raises; detection survives it and
  says what to install.

A CPU quirk, also here: glibc gives each new thread its own malloc arena, and the speed of a
prefill's large temporaries depends on the state of the arena of the thread that runs
``generate()`` (README "Performance", chat overhead). On CPU we limit glibc to one arena, as
``MALLOC_ARENA_MAX=1`` would, unless that variable is set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ConfigError, DeviceUnavailableError
from .settings import Settings

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
NEURON_INSTALL_HINT = (
    "install torch-neuronx from the AWS Neuron pip repository on a Trainium host "
    "(see README: 'Running on Trainium'); the PyPI package of that name is a placeholder"
)


@dataclass(frozen=True)
class HostDevices:
    """What this host offers."""

    neuron_cores: int
    cuda_devices: int
    neuron_problem: str | None = None  # why Neuron is unusable although something was found


@dataclass(frozen=True)
class Placement:
    """Where and how one engine runs."""

    kind: str  # "neuron" | "cuda" | "cpu"
    device: str  # explicit torch device string, e.g. "neuron:0"; never "auto"
    dtype: torch.dtype
    compile: bool
    compile_backend: str  # "neuron" on Neuron, "inductor" elsewhere
    inputs_on_cpu: bool  # generate() inputs stay on CPU (Neuron)
    tp: int = 1  # tensor-parallel degree: >1 means this process holds one shard (torchrun)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def input_device(self) -> str:
        """Where generate() inputs live."""
        return "cpu" if self.inputs_on_cpu else self.device

    @property
    def new_shapes_compile(self) -> bool:
        """Whether a new input shape costs a compile: compiled graphs, or Neuron's per-op eager compiles."""
        return self.compile or self.kind == "neuron"

    @property
    def process_group_backend(self) -> str:
        """torch.distributed backend for this device kind."""
        return {"neuron": "neuron", "cuda": "nccl"}.get(self.kind, "gloo")

    def label(self) -> str:
        mode = f"compiled ({self.compile_backend})" if self.compile else "eager"
        shards = f" · tensor parallel ×{self.tp}" if self.tp > 1 else ""
        return f"{self.device} · {self.dtype_name} · {mode}{shards}"


def _neuron_module():
    """``torch.neuron`` if torch-neuronx registered it, loading it when autoload is off."""
    module = getattr(torch, "neuron", None)
    if module is not None:
        return module, None
    try:
        import torch_neuronx  # noqa: F401 - registers torch.neuron
    except ModuleNotFoundError:
        return None, None
    except ImportError as exc:  # the PyPI placeholder raises ImportError("WRONG PACKAGE ...")
        return None, f"torch_neuronx cannot be imported ({exc}); {NEURON_INSTALL_HINT}"
    return getattr(torch, "neuron", None), None


def detect() -> HostDevices:
    """Look for Neuron cores and CUDA devices; never raises."""
    module, problem = _neuron_module()
    cores = 0
    if module is not None:
        try:
            cores = int(module.device_count()) if module.is_available() else 0
        except Exception as exc:  # noqa: BLE001 - a broken runtime is reported, not fatal
            problem = f"the Neuron runtime failed to answer ({exc}); check neuron-ls"
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return HostDevices(neuron_cores=cores, cuda_devices=cuda, neuron_problem=problem)


def _explicit(flag: str, requested: str, host: HostDevices, default_index: int) -> tuple[str, str]:
    """Turn auto|neuron|cuda|cpu[:N] into (kind, device string); refuse what the host lacks."""
    kind, _, index = requested.partition(":")
    if kind == "auto":
        kind = "neuron" if host.neuron_cores else "cuda" if host.cuda_devices else "cpu"
        index = ""
    if kind == "cpu":
        return "cpu", "cpu"
    count = host.neuron_cores if kind == "neuron" else host.cuda_devices
    if count == 0:
        why = host.neuron_problem if kind == "neuron" and host.neuron_problem else f"no {kind} device on this host"
        hint = NEURON_INSTALL_HINT if kind == "neuron" else "install a CUDA build of torch on a GPU host"
        raise DeviceUnavailableError(flag, f"{why}; {hint}", _allowed(host))
    chosen = int(index) if index else default_index % count
    if chosen >= count:
        raise DeviceUnavailableError(flag, f"{kind}:{chosen} does not exist ({count} visible)", _allowed(host))
    return kind, f"{kind}:{chosen}"


def _allowed(host: HostDevices) -> str:
    options = ["auto", "cpu"]
    if host.neuron_cores:
        options += ["neuron"] + [f"neuron:{i}" for i in range(min(host.neuron_cores, 4))]
    if host.cuda_devices:
        options += ["cuda"] + [f"cuda:{i}" for i in range(min(host.cuda_devices, 4))]
    return ", ".join(options)


def resolve_placements(settings: Settings, host: HostDevices | None = None) -> dict[str, Placement]:
    """Placement of each enabled engine. With several cores, chat and image get different ones."""
    host = detect() if host is None else host
    placements = {}
    for index, engine in enumerate(("chat", "image")):
        if not getattr(settings, engine):
            continue
        override = getattr(settings, f"{engine}_device")
        flag, requested = (f"--{engine}-device", override) if override else ("--device", settings.device)
        # Under --tp N the ranks' shards sit on cores 0..N-1: the whole engine defaults to core N.
        kind, device = _explicit(flag, requested, host, default_index=settings.tp if settings.tp > 1 else index)
        if engine == settings.tp_engine and settings.tp > 1:
            # One shard per process: the core (or GPU) of this torchrun rank.
            kind, device = _explicit(flag, f"{kind}:{settings.local_rank}" if kind != "cpu" else "cpu", host, 0)
            placements[engine] = dataclasses.replace(_placement(settings, kind, device), tp=settings.tp)
            continue
        placements[engine] = _placement(settings, kind, device)
    return placements


def _placement(settings: Settings, kind: str, device: str) -> Placement:
    if settings.dtype == "auto":
        dtype = torch.float32 if kind == "cpu" else torch.bfloat16
    else:
        dtype = _DTYPES[settings.dtype]
    compile_on = settings.compile == "on" or (settings.compile == "auto" and kind == "neuron")
    return Placement(
        kind=kind,
        device=device,
        dtype=dtype,
        compile=compile_on,
        compile_backend="neuron" if kind == "neuron" else "inductor",
        inputs_on_cpu=kind == "neuron",
    )


@dataclass(frozen=True)
class CacheSetup:
    """Where compiled programs are cached, and why not if they cannot be."""

    folder: Path | None
    problem: str | None = None


def configure_compile_cache(cache_root: Path) -> CacheSetup:
    """Point the NEFF and inductor caches at ``cache_root/compile-cache``; call before compiling.

    An unwritable folder is reported and worked around: compiles still run, uncached (Neuron) or
    cached in a throwaway temp folder (inductor).
    """
    folder = Path(cache_root) / "compile-cache"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        os.environ["TORCH_NEURONX_NEFF_DISABLE_CACHE"] = "1"
        os.environ["TORCH_NEURONX_DISABLE_NEFF_CACHE"] = "1"  # the docs' spelling; the code reads the other
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
        return CacheSetup(None, f"compile cache {folder} is not writable ({exc}); compiling without a persistent cache")
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(folder / "neff")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    return CacheSetup(folder)


M_ARENA_MAX = -8  # glibc's mallopt() parameter number (malloc.h)


def limit_malloc_arenas(placements: dict[str, Placement]) -> str | None:
    """On CPU, ask glibc for one malloc arena shared by all threads; return what was done, or None.

    Threads that already own an arena keep it; threads started later (the chat engine's generate
    thread, Gradio's workers) share the main one. Skipped when ``MALLOC_ARENA_MAX`` is set (glibc
    read it at start), when no engine runs on CPU, and off glibc.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return f"malloc arenas: MALLOC_ARENA_MAX={os.environ['MALLOC_ARENA_MAX']} (from the environment)"
    if not any(p.kind == "cpu" for p in placements.values()) or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = libc.mallopt(M_ARENA_MAX, 1) == 1
    except (OSError, AttributeError):
        done = False
    return "malloc arenas: 1 (as MALLOC_ARENA_MAX=1)" if done else None


class CompileCounter:
    """Counts graph compiles (dynamo's unique graphs: the CPU proxy for Neuron compiles).

    The counters are process-wide, so a delta taken around a request also sees compiles made
    by another engine at the same time; the warm-up status uses it as a recompile alarm.
    """

    @staticmethod
    def graphs() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    @staticmethod
    def cache_hits() -> tuple[int, int]:
        """(hits, misses) of the on-disk compiled-graph cache so far in this process."""
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])


def synchronize(placement: Placement) -> None:
    """Wait for queued device work, so timings measure it."""
    if placement.kind == "cuda":
        torch.cuda.synchronize(placement.device)
    elif placement.kind == "neuron":
        torch.neuron.synchronize()


def describe(placements: dict[str, Placement], host: HostDevices | None = None) -> dict:
    """Plain-data description of the host and the placements for the UI and the log."""
    host = detect() if host is None else host
    if host.neuron_cores:
        accelerator = f"Trainium (Neuron) · {host.neuron_cores} cores visible"
    elif host.cuda_devices:
        accelerator = f"CUDA · {torch.cuda.get_device_name(0)}"
    else:
        accelerator = f"CPU · {os.cpu_count()} cores · {platform.machine()}"
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "diffusers", "gradio", "torch_neuronx"):
        versions[name] = _version(name)
    return {
        "accelerator": accelerator,
        "neuron_cores": host.neuron_cores,
        "neuron_problem": host.neuron_problem,
        "engines": {name: {"device": p.device, "kind": p.kind, "dtype": p.dtype_name, "compile": p.compile,
                           "backend": p.compile_backend, "label": p.label()} for name, p in placements.items()},
        "versions": {k: v for k, v in versions.items() if v},
    }


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return None


def refuse_idle_compile_flags(settings: Settings, placements: dict[str, Placement]) -> None:
    """ConfigError when --compile-repeated-blocks would be ignored: the image engine runs eager here."""
    image = placements.get("image")
    if settings.compile_repeated_blocks and image is not None and not image.compile:
        raise ConfigError("--compile-repeated-blocks", f"compiles nothing here: the image engine runs eager on "
                          f"{image.device} (--compile {settings.compile}; auto compiles only on neuron)",
                          "--compile on, or leave out --compile-repeated-blocks")
