"""Every difference between neuron, cuda and cpu lives here; engines ask, they do not branch.

The Neuron facts acted on here: docs/trainium.md, "The Neuron facts the code relies on"; the CPU
malloc-arena limit: docs/performance.md, "2. Chat overhead".
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import logging
import os
import platform
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .compile_cache import (  # noqa: F401 - part of this module's API
    CacheSetup,
    CompileCounter,
    configure_compile_cache,
    device_counters,
    use_neuron_counters,
)
from .errors import ConfigError, DeviceMemoryError, DeviceUnavailableError
from .messages import tr
from .plugins import Elsewhere, Sharding
from .settings import Settings
from .shapes import ShapeKey

log = logging.getLogger("showcase.devices")

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
NEURON_INSTALL_HINT = (
    "install torch-neuronx from the AWS Neuron pip repository on a Trainium host "
    "(see docs/trainium.md); the PyPI package of that name is a placeholder"
)


@dataclass(frozen=True)
class HostDevices:
    """What this host offers."""

    neuron_cores: int
    cuda_devices: int
    neuron_problem: str | None = None  # why Neuron is unusable although something was found
    visible_cores: str | None = None  # NEURON_RT_VISIBLE_CORES as this process was started with it


@dataclass(frozen=True)
class Placement:
    """Where and how one engine runs."""

    kind: str  # "neuron" | "cuda" | "cpu" | "remote" (--chat-server, --image-server: it runs on other servers)
    device: str  # explicit torch device string, e.g. "neuron:0"; never "auto"; remote: the servers' base URLs
    dtype: torch.dtype
    compile: bool
    compile_backend: str  # "neuron" on Neuron, "inductor" elsewhere
    inputs_on_cpu: bool  # generate() inputs stay on CPU (Neuron)
    tp: int = 1  # tensor-parallel degree: >1 means this process holds one shard (torchrun)
    core: int | None = None  # the device index the engine's threads select (neuron core, cuda ordinal); cpu: None
    first_core: int = 0  # the first index this process holds: under torchrun on Neuron, the local rank
    served_by: str = ""  # remote: what serves it there ("OpenAI-compatible server", "image workers")

    @property
    def runtime_core(self) -> int | None:
        """The Neuron runtime's index of ``core`` (from 0 in each process): memory-total queries take it, the
        allocator's counters take ``core`` (docs/trainium.md, "Memory on one NeuronCore")."""
        return None if self.core is None else self.core - self.first_core

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
        if self.kind == "remote":
            return f"{self.device} · {self.served_by}"
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
    return HostDevices(neuron_cores=cores, cuda_devices=cuda, neuron_problem=problem,
                       visible_cores=os.environ.get("NEURON_RT_VISIBLE_CORES"))


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


def resolve_placements(settings: Settings, host: HostDevices | None = None,
                       elsewhere: Mapping[str, Elsewhere] | None = None,
                       sharding: Sharding | None = None) -> dict[str, Placement]:
    """Placement of each enabled engine. With several cores, chat and image get different ones; an engine a
    plug-in runs ``elsewhere`` (on other servers) gets no device here; the engine of ``sharding`` holds this
    rank's shard."""
    host = detect() if host is None else host
    tp, sharded = (sharding.count, sharding.engine) if sharding is not None else (1, None)
    placements = {}
    for index, engine in enumerate(("chat", "image")):
        if not getattr(settings, engine):
            continue
        if engine in (elsewhere or {}):
            there = elsewhere[engine]
            placements[engine] = Placement("remote", ",".join(there.servers), torch.float32, False, "none", True,
                                           served_by=there.served_by)
            continue
        override = getattr(settings, f"{engine}_device")
        flag, requested = (f"--{engine}-device", override) if override else ("--device", settings.device)
        # Under --tp N the ranks' shards sit on devices 0..N-1: on cuda the whole engine defaults to N.
        kind, device = _explicit(flag, requested, host, default_index=tp if tp > 1 else index)
        if tp > 1 and kind == "neuron" and engine != sharded:
            device = _whole_engine_core_under_tp(engine, flag, requested, settings, tp)
        if engine == sharded and tp > 1:
            # One shard per process: the core (or GPU) of this torchrun rank.
            kind, device = _explicit(flag, f"{kind}:{settings.local_rank}" if kind != "cpu" else "cpu", host, 0)
            placements[engine] = dataclasses.replace(_placement(settings, kind, device), tp=tp)
        else:
            placements[engine] = _placement(settings, kind, device)
        if tp > 1 and kind == "neuron":  # the process holds only its own core (init_process_group)
            placements[engine] = dataclasses.replace(placements[engine], first_core=settings.local_rank)
    if settings.world_size > 1 and any(p.kind == "neuron" for p in placements.values()):
        refuse_exported_visible_cores(settings, tp)
    return placements


def refuse_exported_visible_cores(settings: Settings, tp: int = 1) -> None:
    """Under torchrun, ConfigError for an exported NEURON_RT_VISIBLE_CORES: TorchNeuron would stop every rank at
    its one-device-per-process assertion, with no word of what to change."""
    if settings.exported_visible_cores:
        raise ConfigError("NEURON_RT_VISIBLE_CORES", f"is exported as {settings.exported_visible_cores!r}, but under "
                          "torchrun TorchNeuron gives each rank its own core (NEURON_RT_VISIBLE_CORES=LOCAL_RANK, "
                          "set only when unset) and allows one device per process",
                          f"unset it for the torchrun command: env -u NEURON_RT_VISIBLE_CORES torchrun "
                          f"--nproc_per_node={settings.world_size} app.py --tp {tp}")


def _whole_engine_core_under_tp(engine: str, flag: str, requested: str, settings: Settings, tp: int) -> str:
    """The core of the engine that runs whole beside a Neuron tensor-parallel group: this rank's own, the only
    one its process sees; ConfigError when ``requested`` names another."""
    own = f"neuron:{settings.local_rank}"
    _, _, index = requested.partition(":")
    if index and int(index) != settings.local_rank:
        raise ConfigError(flag, f"under torchrun each rank's process sees only its own NeuronCore, so the whole "
                          f"{engine} engine cannot run on neuron:{index} beside the --tp {tp} group",
                          f"leave {flag} unset (the {engine} engine then shares {own} with this rank's shard), "
                          f"or --no-{engine}")
    return own


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
        core=int(device.partition(":")[2]) if kind != "cpu" else None,
    )


M_ARENA_MAX = -8  # glibc's mallopt() parameter number (malloc.h)


def limit_malloc_arenas(placements: dict[str, Placement]) -> str | None:
    """On CPU, ask glibc for one malloc arena shared by threads started later; return what was done, or None.

    Skipped when ``MALLOC_ARENA_MAX`` is set (glibc read it at start), when no engine runs on CPU, and off glibc.
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


def on_device(placement: Placement) -> contextlib.AbstractContextManager:
    """The device context of ``placement`` for the calling thread; enter it around an engine's device work.

    Nothing on cpu; cheap to re-enter. Why: the current device is per thread (docs/trainium.md, "Threads").
    """
    if placement.core is None or placement.kind not in ("neuron", "cuda"):
        return contextlib.nullcontext()
    module = torch.neuron if placement.kind == "neuron" else torch.cuda
    return module.device(placement.core)


def bound(placement: Placement, target: Callable) -> Callable:
    """``target`` wrapped to run inside ``on_device(placement)``: the target of a thread that does device work."""

    @functools.wraps(target)
    def run(*args, **kwargs):
        with on_device(placement):
            return target(*args, **kwargs)

    return run


def falls_back_to_eager(placement: Placement) -> bool:
    """Whether a shape whose compile failed is retried eager: on Neuron with compile on, where a failed
    compile raises (``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION`` defaults to true)."""
    return placement.compile and placement.kind == "neuron"


def compile_or_eager(engine, key: ShapeKey, attempt: Callable, *args):
    """``attempt(*args)``, warming up shape ``key``; on Neuron, when it fails, note the error in
    ``engine.shapes.eager[key]`` (which then runs uncompiled) and run it once more. A second failure is
    raised; an out-of-memory raises DeviceMemoryError. The chat engine falls back per graph instead.
    """
    placement, fell_back = engine.placement, engine.shapes.eager
    try:
        return attempt(*args)
    except Exception as exc:
        # A device mix-up is a bug to show, not a compile to work around (eager would hide it).
        if not falls_back_to_eager(placement) or key in fell_back or "Inconsistent device IDs" in str(exc):
            raise
        refuse_out_of_memory(exc, key, placement)
        fell_back[key] = short_error(exc)
        log.warning("%s failed to compile on %s; running it eager: %s", key, placement.device, fell_back[key])
        return attempt(*args)


class GraphFallbacks:
    """The compiled graphs of one engine that failed to compile on Neuron: each is attempted once.

    A graph is a hashable key (chat: ``static_cache.Graph``); a plan is the set of graphs a shape runs
    compiled. An ``attempt`` must synchronize before it returns: Neuron raises a compile error late.
    Why and how the blame falls: docs/trainium.md, "Eager fallback, per graph".
    Thread-safety: ``warm_up`` runs on the warm-up thread; ``compiled`` is read by request threads.
    """

    def __init__(self, placement: Placement):
        self.placement = placement
        self.failed: dict[Hashable, str] = {}  # graph -> its compile error (short_error)
        self._ran: set = set()  # graphs that ran compiled in a warm-up that succeeded
        self._chosen: dict[ShapeKey, frozenset] = {}  # shape -> the graphs it runs compiled

    def compiled(self, key: ShapeKey, default: frozenset) -> frozenset:
        """The graphs shape ``key`` runs compiled: its plan, or ``default`` before its warm-up chose one."""
        return self._chosen.get(key, default)

    def warm_up(self, key: ShapeKey, plans: Sequence[frozenset], attempt: Callable[[], object]) -> frozenset:
        """``attempt()`` under each plan without a failed graph (an empty plan last) until one succeeds; return
        that plan. ``attempt`` reads it through ``compiled(key)``. Raised as is: a failure off Neuron or with
        compile off, of the empty plan, or a device mix-up."""
        plans = list(dict.fromkeys([*plans, frozenset()]))
        for index, graphs in enumerate(plans):
            if graphs & self.failed.keys():
                continue
            self._chosen[key] = graphs
            try:
                attempt()
            except Exception as exc:
                if not graphs or not falls_back_to_eager(self.placement) or "Inconsistent device IDs" in str(exc):
                    raise
                refuse_out_of_memory(exc, key, self.placement)
                self._blame(key, graphs - plans[index + 1], short_error(exc))
                continue
            self._ran |= graphs
            return graphs
        raise AssertionError("unreachable: the empty plan is never skipped")

    def _blame(self, key: ShapeKey, graphs: frozenset, error: str) -> None:
        blamed = (graphs - self._ran) or graphs
        self.failed.update(dict.fromkeys(blamed, error))
        log.warning("%s: %d graph(s) failed to compile on %s (%s); running without them: %s", key, len(blamed),
                    self.placement.device, ", ".join(map(str, sorted(blamed))), error)


def _chain(exc: BaseException | None):
    """``exc`` and what it wraps (dynamo's ``inner_exception``, ``__cause__``, ``__context__``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps) says the device ran out of memory: torch's OutOfMemoryError, or
    "out of memory" in its text (the Neuron runtime's wording for a failed allocation is not documented)."""
    return any(isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower() for e in _chain(exc))


def refuse_out_of_memory(exc: BaseException, key: ShapeKey, placement: Placement) -> None:
    """Raise DeviceMemoryError when ``exc`` is an out-of-memory: a shape that did not fit is no compile failure to
    retry eager (eager needs the same memory, and the retry would hide why)."""
    if out_of_memory(exc):
        raise DeviceMemoryError(tr(
            "shape {shape} ran out of memory on {device} ({error}); it is not retried eager. Serve fewer or "
            "smaller shapes (--sizes, --references, --chat-buckets, --chat-batch), or give the engine a core of "
            "its own (--chat-device, --image-device).", shape=str(key), device=placement.device,
            error=short_error(exc))) from exc


def short_error(exc: BaseException) -> str:
    """'Type: first line (Cause: first line)', at most 300 characters: dynamo wraps a backend's error."""
    def first(e: BaseException) -> str:
        return (str(e).strip().splitlines() or [""])[0]

    text = f"{type(exc).__name__}: {first(exc)}"
    inner = getattr(exc, "inner_exception", None) or exc.__cause__
    if inner is not None and first(inner) not in text:
        text += f" ({type(inner).__name__}: {first(inner)})"
    return text[:300]


@contextlib.contextmanager
def uncompiled(module: torch.nn.Module, eager: bool = True):
    """Run ``module`` (compiled with ``Module.compile``, whole or per block) uncompiled inside the block.

    The caller must own the module for the duration (an engine's job lock): the switch is not per thread.
    """
    compiled = [m for m in module.modules() if getattr(m, "_compiled_call_impl", None) is not None] if eager else []
    saved = [m._compiled_call_impl for m in compiled]
    for m in compiled:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, impl in zip(compiled, saved, strict=True):
            m._compiled_call_impl = impl


def synchronize(placement: Placement) -> None:
    """Wait for the work queued on the placement's own core (not the calling thread's), so timings measure it."""
    if placement.kind == "cuda":
        torch.cuda.synchronize(placement.device)
    elif placement.kind == "neuron":
        torch.neuron.synchronize(placement.core)


def core_report(host: HostDevices) -> str:
    """How many NeuronCores this process holds, and whether NEURON_RT_VISIBLE_CORES limits them (for the log)."""
    if host.visible_cores:
        return f"{host.neuron_cores} NeuronCore(s) visible to this process (NEURON_RT_VISIBLE_CORES=" \
               f"{host.visible_cores})"
    return (f"{host.neuron_cores} NeuronCore(s) visible to this process; NEURON_RT_VISIBLE_CORES is unset, so the "
            "Neuron runtime reserves every core on the host for this process until it exits (set it, e.g. "
            "NEURON_RT_VISIBLE_CORES=0-1, to leave the others to other processes)")


def describe(placements: dict[str, Placement], host: HostDevices | None = None) -> dict:
    """Plain-data description of the host and the placements for the UI and the log."""
    host = detect() if host is None else host
    if host.neuron_cores:
        accelerator = f"Trainium (Neuron) · {host.neuron_cores} cores visible"
        log.info("Neuron: %s; compile counter: %s", core_report(host), CompileCounter.source())
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


def repeated_blocks(settings: Settings, placement: Placement) -> bool:
    """Whether the image transformer compiles each repeated block class once rather than whole: on/off as
    --compile-repeated-blocks says; auto where it compiles on neuron (docs/trainium.md, "The first run")."""
    mode = settings.compile_repeated_blocks
    return placement.compile and (mode == "on" or (mode == "auto" and placement.kind == "neuron"))


def refuse_idle_compile_flags(settings: Settings, placements: dict[str, Placement]) -> None:
    """ConfigError when --compile-repeated-blocks on would be ignored: the image engine runs eager here."""
    image = placements.get("image")
    if settings.compile_repeated_blocks == "on" and image is not None and not image.compile:  # auto never
        raise ConfigError("--compile-repeated-blocks", f"compiles nothing here: the image engine runs eager on "
                          f"{image.device} (--compile {settings.compile}; auto compiles only on neuron)",
                          "--compile on, or --compile-repeated-blocks auto|off")
