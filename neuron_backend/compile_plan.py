"""The first-run compile plan: the graphs and eager programs each warm-up task builds, and their estimated time.

Before anything is compiled the warm-up knows what it will compile: per chat bucket its new prefill-chunk
graphs (and, for the first bucket, the decode graph of every cache window it may reach), per image size or
edit slot the transformer's graphs, and the eager programs a device compiles for the rest (on Neuron an eager
module is compiled too, once per input shape). Each count times a per-graph estimate gives a first-run ETA;
the learned timing history (warmup.TimingHistory) replaces a task's estimate once it has run here.

The seconds are estimates, not measurements: no compile in this project has run on a Trainium host yet.
They are set on the high side from the Neuron documentation's "minutes per graph" for models of this size,
so that a first start is not promised sooner than it can end.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chat import static_cache
from .devices import Placement, repeated_blocks
from .shapes import EditSlot, ShapeKey

# Estimated seconds per compiled graph or eager program on a first run (empty compile cache), by device
# family and what is compiled. Neuron: neuronx-cc on one trn2 core; elsewhere: inductor on the host.
SECONDS_PER_GRAPH = {
    ("neuron", "chat"): 600.0,  # a whole-model Qwen3-0.6B graph (28 layers, one static KV cache)
    ("neuron", "image"): 2400.0,  # a whole FLUX.2-klein-4B transformer graph (5 double + 20 single blocks)
    ("neuron", "image-block"): 600.0,  # one repeated transformer block class (--compile-repeated-blocks)
    ("neuron", "eager"): 300.0,  # one module run eager: its ops compiled for one input shape
    ("other", "chat"): 60.0,
    ("other", "image"): 120.0,
    ("other", "image-block"): 60.0,
    ("other", "eager"): 0.0,  # eager on CPU or CUDA compiles nothing
}
FLUX2_BLOCK_CLASSES = 2  # the double-stream and the single-stream block: one graph each per shape


@dataclass(frozen=True)
class TaskPlan:
    """What one compile task of the warm-up builds, and its first-run estimate in seconds."""

    graphs: int  # compiled graphs (torch.compile)
    eager_programs: int  # modules run eager whose ops the device compiles for this shape (Neuron only)
    estimate_s: float


def family(placement: Placement) -> str:
    """"neuron" or "other": which column of SECONDS_PER_GRAPH a placement reads."""
    return "neuron" if placement.kind == "neuron" else "other"


def chat_plan(settings, placement: Placement, buckets: list[int], index: int) -> TaskPlan:
    """The graphs the warm-up of ``buckets[index]`` compiles that no earlier bucket compiled.

    The first bucket also compiles the decode graph of every cache window a reply may reach
    (chat/engine.py's warm-up); each bucket adds the prefill-chunk graphs earlier buckets lack.
    """
    windows = static_cache.declared(settings.cache_windows, settings.context_length)
    chunk = static_cache.chunk_size(settings, placement.compile)
    bucket = buckets[index]
    eager = int(placement.kind == "neuron" and not chunk)  # the prefill (with compile off: all) runs eager
    graphs = 0
    if placement.compile:
        earlier = {g for b in buckets[:index] for g in static_cache.prefill_graphs(b, chunk, windows)}
        graphs = len(static_cache.prefill_graphs(bucket, chunk, windows) - earlier)
        graphs += len(static_cache.decode_graphs(bucket, windows)) if index == 0 else 0
    return _priced(placement, "chat", graphs, eager)


def image_plan(settings, placement: Placement, shape: ShapeKey, index: int) -> TaskPlan:
    """The transformer's graphs at this size or edit slot, and the eager programs around it.

    Eager programs: the VAE decode at this shape, the text encoder once (its input length is fixed), the VAE
    encode of the references of an edit slot, and the transformer itself when compile is off, or its layers
    outside the blocks (embedders, final norm and projection) when only the repeated blocks compile.
    """
    blocks = repeated_blocks(settings, placement)  # on by default where the image engine compiles on neuron
    graphs = (FLUX2_BLOCK_CLASSES if blocks else 1) if placement.compile else 0
    eager = 0
    if placement.kind == "neuron":
        eager = 1 + (index == 0) + isinstance(shape, EditSlot) + (not placement.compile or blocks)
    return _priced(placement, "image-block" if blocks else "image", graphs, eager)


def _priced(placement: Placement, kind: str, graphs: int, eager: int) -> TaskPlan:
    side = family(placement)
    seconds = graphs * SECONDS_PER_GRAPH[side, kind] + eager * SECONDS_PER_GRAPH[side, "eager"]
    return TaskPlan(graphs, eager, seconds)
