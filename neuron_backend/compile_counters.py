"""Compile counters (TorchNeuron's own on Neuron, dynamo's elsewhere) and the panel's device counters.

On Neuron the backend uses no Inductor, so inductor's cache counters never move, and
eager per-op compiles (a new prefill length, the text encoder, the VAE) are no Dynamo graphs. With
metrics enabled (``torch_neuronx.metrics.set_enabled(True)``, done on first use),
TorchNeuron counts every NEFF, eager or graph: ``CompilationCache.TotalCompilations`` (compiled
now), ``CompilationCache.PersistentHits`` (read from the NEFF cache folder) and
``...PersistentMisses``. A "new program" is a compile or a persistent hit: either means a shape
that this process had not run before. Where the metrics API is missing, the count falls back to
``counters["neuron"]["compiled_graphs"]`` (torch.compile graphs only) and then to dynamo's graphs;
``source()`` says which one is shown. ``torch.neuron.get_dynamo_metrics()`` is not read here: it
synchronises, and the panel polls while requests run.
"""

from __future__ import annotations

import sys

from .messages import tr

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
        """New compiled programs so far in this process (see the module docstring for what counts)."""
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
        """Compiled programs loaded whole so far (``aot.py``): no trace and no compile, a cache hit."""
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
