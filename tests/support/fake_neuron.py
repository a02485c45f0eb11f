"""A stand-in for the ``torch.neuron`` module torch-neuronx registers, modelling what placement needs.

What it models (from TorchNeuron's source and the Neuron docs; docs/trainium.md):
- the current device is THREAD-LOCAL; a thread that never chose one uses a process-wide default,
  fixed by the first ``set_device`` of any thread (device guards call it when they switch), else 0;
- ``device(i)`` switches the calling thread and restores it on exit; ``synchronize(device=None)``
  waits for the given core (None: the calling thread's current one) and is recorded;
- a compiled graph (the ``"neuron"`` dynamo backend below) allocates its outputs on the calling
  thread's current device and raises "Inconsistent device IDs" when that is not the core its weights
  sit on. Weights are CPU tensors here; ``place`` records which core each one "sits on", the way
  ``from_pretrained(device_map="neuron:1")`` / ``pipe.to("neuron:1")`` would put them there (and,
  like the copy's device guard, selects that core on the loading thread while it copies).
- memory as the runtime reports it: ``get_device_properties(i).total_memory`` is the runtime's limit for
  its core i (``nrt_get_vnc_memory_stats``), 24 GiB of HBM per logical core at LNC=2 less the micro-code
  the runtime keeps on each of its two physical cores (``REPORTED_TOTAL``); a core the runtime does not
  have reads 0 (TorchNeuron's fallback when the query fails). ``memory_allocated(i)`` takes PyTorch's
  index;
- torchrun (``torchrun=(local_rank, local_world_size)``): as after ``init_process_group("neuron")``, the
  process holds only its own core: ``device_count()`` is the local world size, ``set_device`` takes only
  the local rank, and the runtime numbers its one core 0, so ``get_device_properties(local_rank)`` reads 0
  on every rank but 0 (TorchNeuron passes PyTorch's index to the runtime unchanged);
- a compile error as Neuron surfaces it (``deferred_error``): not when dynamo hands over the graph but
  when the graph first runs, where its NEFF compile is submitted; the error is raised there
  (``deferred_at="execution"``) or left pending and raised, and cleared, by the next ``synchronize()``
  (``"synchronize"``), and only for the graphs ``failing`` picks by query length (``lambda q: q > 1``:
  the prefill chunks fail, decode does not). A failed compile is not kept: the graph's next run
  submits it again, and each submission is counted in ``compile_attempts``.
- a compiled graph saved ahead of time (``saveable``): torch's ``aot_compile`` takes only a backend result
  that is a ``SerializableCallable`` and serialises its artifacts when the function is saved
  (``save_compiled_function``). Whether TorchNeuron's result is one, and pickles, is unknown; with
  ``saveable=False`` (the default) the result is a plain function, which ``aot_compile`` refuses at compile;
  with ``"unpicklable"`` it is a SerializableCallable whose executor holds a runtime handle (a lock), so the
  save raises a pickling error (``TypeError: cannot pickle '_thread.lock' object``), each counted in
  ``save_attempts``;
- an out-of-memory (``run_error``): an exception each compiled call raises when it runs.

The engines then run the real tiny models on CPU tensors with a placement that says ``neuron:i``
(``cpu_backed``): the device module believes the weights sit on core i; only tensors are on CPU.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
import types
from collections.abc import Callable

import torch
from torch._dynamo.aot_compile_types import SerializableCallable

INCONSISTENT = "Inconsistent device IDs found in kernel outputs: expected device {} but found device {}"
HBM_PER_CORE = 24 << 30  # one logical core of Trainium2 at LNC=2 (96 GiB per chip, 4 logical cores)
MICROCODE = 96 << 20  # the runtime's micro-code overhead per physical NeuronCore (2 per logical core at LNC=2)
REPORTED_TOTAL = HBM_PER_CORE - 2 * MICROCODE  # total_memory as the fake runtime reports it


class FakeNeuron(types.SimpleNamespace):
    def __init__(self, cores: int = 2, total_memory: int = REPORTED_TOTAL, torchrun: tuple[int, int] | None = None):
        super().__init__()
        self.cores, self.total_memory = (torchrun[1], total_memory) if torchrun else (cores, total_memory)
        # PyTorch indices this process may select, and how many cores its runtime holds (numbered from 0)
        self.own = range(torchrun[0], torchrun[0] + 1) if torchrun else range(self.cores)
        self.runtime_cores = len(self.own)
        self._local = threading.local()
        self._default: int | None = torchrun[0] if torchrun else None  # distributed init sets the local rank
        self._lock = threading.Lock()
        self.synchronized: list[int] = []  # the core each synchronize() waited for
        self.compiled_calls: list[tuple[int, int]] = []  # (weights core, current device) of each compiled call
        self._weights: dict[int, int] = {}  # storage data_ptr -> core
        self.fallback_ops: list[str] = []
        self.compile_error: str | None = None  # set: every graph compile raises it (neuronx-cc failing)
        self.deferred_error: str | None = None  # set: the compiles ``failing`` picks fail when the graph runs
        self.deferred_at = "execution"  # or "synchronize": where a deferred error is raised
        self.failing: Callable[[int], bool] = lambda query: True  # by the graph's query length
        self.compile_attempts: list[int] = []  # query length of each NEFF compile submitted at a graph's run
        self.compiled_queries: list[int] = []  # query length of each compiled call that ran
        self._pending: list[_Graph] = []  # graphs whose failed compile the next synchronize() raises
        self.saveable: bool | str = False  # "unpicklable": a SerializableCallable whose save fails (above)
        self.save_attempts = 0
        self.run_error: BaseException | None = None  # raised by every compiled call (an out-of-memory)

    # ----- torch.neuron ---------------------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.cores

    def current_device(self) -> int:
        index = getattr(self._local, "index", None)
        if index is not None:
            return index
        return 0 if self._default is None else self._default

    def set_device(self, index: int) -> None:
        if index not in self.own:
            raise ValueError(f"Device index {index} is out of range. Valid range is {self.own.start} to "
                             f"{self.own.stop - 1} for this process")
        self._local.index = index
        with self._lock:
            if self._default is None:
                self._default = index

    def device(self, index):
        fake = self

        class _Device:
            def __enter__(self):
                self.previous = fake.current_device()
                if self.previous != index:
                    fake.set_device(index)

            def __exit__(self, *exc):
                if self.previous != index:
                    fake.set_device(self.previous)

        return _Device()

    def synchronize(self, device=None) -> None:
        self.synchronized.append(self.current_device() if device is None else int(device))
        failed, self._pending = self._pending, []
        for graph in failed:
            graph.submitted = False  # not kept: the next run submits the compile again
        if failed:
            raise RuntimeError(self.deferred_error)

    def memory_allocated(self, device=None) -> int:
        core = self.current_device() if device is None else int(device)
        return sum(1 for c in self._weights.values() if c == core) * 4096

    def get_device_properties(self, device=None):
        index = self.current_device() if device is None else int(str(device).rpartition(":")[2] or 0)
        if not 0 <= index < self.device_count():
            raise ValueError(f"Invalid device id: {index}")
        # the index goes to the runtime unchanged; a core it does not hold reads 0 (the query failed)
        total = self.total_memory if index < self.runtime_cores else 0
        return types.SimpleNamespace(name="fake trainium2 core", total_memory=total)

    def is_bf16_supported(self) -> bool:
        return True

    # ----- the stand-in compiled call --------------------------------------------------------
    def place(self, tensors, core: int) -> None:
        """Record that these weights sit on ``core`` (a module or tensors); the copy's guard selects it meanwhile."""
        if isinstance(tensors, torch.nn.Module):
            tensors = [*tensors.parameters(), *tensors.buffers()]
        with self.device(core):
            for t in tensors:
                self._weights[t.untyped_storage().data_ptr()] = core

    def _weights_core(self, args) -> int | None:
        for a in args:
            if isinstance(a, torch.Tensor) and a.numel():
                core = self._weights.get(a.untyped_storage().data_ptr())
                if core is not None:
                    return core
        return None

    def backend(self, gm: torch.fx.GraphModule, example_inputs):
        """The "neuron" dynamo backend: runs the graph, first checking where its outputs would go."""
        from torch._dynamo.utils import counters

        if self.compile_error is not None:  # Neuron 2.33 raises instead of falling back to eager
            raise RuntimeError(self.compile_error)
        counters["neuron"]["compiled_graphs"] += 1  # what TorchNeuron's backend counts per graph
        fake, graph = self, _Graph(_query_length(gm))

        def compiled(*args):
            core, current = fake._weights_core(args), fake.current_device()
            fake.compiled_calls.append((core, current))
            if core is not None and core != current:  # outputs allocated on the current device
                raise RuntimeError(INCONSISTENT.format(core, current))
            fake._submit(graph)
            if fake.run_error is not None:
                raise fake.run_error
            fake.compiled_queries.append(graph.query)
            return gm.forward(*args)

        return _NeffExecutable(compiled, fake) if self.saveable == "unpicklable" else compiled

    def _submit(self, graph: _Graph) -> None:
        """A graph's first run (or its first since its compile failed) submits its NEFF compile."""
        if graph.compiled or graph.submitted:
            return
        self.compile_attempts.append(graph.query)
        if self.deferred_error is None or not self.failing(graph.query):
            graph.compiled = True
        elif self.deferred_at == "execution":
            raise RuntimeError(self.deferred_error)
        else:  # the run goes on; the error waits for the next synchronize()
            graph.submitted = True
            self._pending.append(graph)


class _NeffExecutable(SerializableCallable):
    """A compiled graph as ``aot_compile`` accepts it, whose artifacts do not pickle: it holds a runtime handle."""

    def __init__(self, run: Callable, fake: FakeNeuron):
        self.run, self.fake, self.handle = run, fake, threading.Lock()

    def __call__(self, *args):
        return self.run(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn: _NeffExecutable) -> bytes:
        fn.fake.save_attempts += 1
        return pickle.dumps(fn.handle)  # TypeError: cannot pickle '_thread.lock' object

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes):
        raise AssertionError("never saved, so never loaded")


@dataclasses.dataclass
class _Graph:
    query: int  # the query length of its input_ids ([B, query]); 0 when it has none
    compiled: bool = False
    submitted: bool = False  # compiling (its error pending)


def _query_length(gm: torch.fx.GraphModule) -> int:
    """The last dim of the graph's ``input_ids`` input (dynamo names it ``l_kwargs_input_ids_``); 0 if none."""
    for node in gm.graph.nodes:
        if node.op == "placeholder" and "input_ids" in node.name:
            return int(node.meta["example_value"].shape[-1])
    return 0


def install(monkeypatch, cores: int = 2, torchrun: tuple[int, int] | None = None) -> FakeNeuron:
    """Put a FakeNeuron at ``torch.neuron`` and its backend at ``torch.compile(backend="neuron")``.

    ``torchrun``: (local rank, local world size) of a process torchrun started, after its process group."""
    from torch._dynamo.backends import registry

    fake = FakeNeuron(cores, torchrun=torchrun)
    monkeypatch.setattr(torch, "neuron", fake, raising=False)
    monkeypatch.setitem(registry._BACKENDS, "neuron", None)
    monkeypatch.setitem(registry._COMPILER_FNS, "neuron", fake.backend)
    return fake


def cpu_backed(placement):
    """The same placement (kind, core, compile, backend) with its tensors on CPU in float32."""
    return dataclasses.replace(placement, device="cpu", dtype=torch.float32)


def cpu_backed_placements(monkeypatch) -> None:
    """Placements resolve as on Neuron (kind, core, compile), each one's tensors on CPU (``cpu_backed``)."""
    from neuron_backend import devices

    real = devices.resolve_placements
    monkeypatch.setattr(devices, "resolve_placements", lambda settings, host=None, elsewhere=None, sharding=None: {
        name: cpu_backed(placement) for name, placement in real(settings, host, elsewhere).items()})


def place_on_load(monkeypatch, fake: FakeNeuron) -> None:
    """After each engine's load(), record its weights on its placement's core (what the real copy does)."""
    from neuron_backend.chat.engine import ChatEngine
    from neuron_backend.image.engine import ImageEngine

    def wrap(cls, modules):
        original = cls.load

        def load(self, folder):
            original(self, folder)
            if self.placement.core is None:  # a CPU engine beside the neuron ones: nothing sits on a core
                return
            for module in modules(self):
                fake.place(module, self.placement.core)

        monkeypatch.setattr(cls, "load", load)

    wrap(ChatEngine, lambda e: [e.model])
    wrap(ImageEngine, lambda e: [m for m in e._pipe.components.values() if isinstance(m, torch.nn.Module)])
