"""Memory before loading: what each engine will need (from its files' headers and configs, no weight read),
what its device has free (None: unknown, nothing refused), which dtype and VAE decode fit.

The estimates, term by term, and the Trainium2 figures: docs/trainium.md, "Memory on one NeuronCore".
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .messages import tr
from .shapes import reference_size
from .weights import tensor_shapes, weight_files

GIB = 1024**3
DECODE_FACTOR = 15
ACTIVATION_SHARE = 0.10
HOST_OVERHEAD = 1 * GIB
DEVICE_HEADROOM = 2 * GIB  # kept free on an accelerator beside the estimate (the runtime's own allocations)
TOKEN_FACTOR = 16  # activations alive per token of one transformer block, in units of its width
PATCH = 16  # pixels per token side: FLUX.2's VAE downsamples by 8, the transformer patchifies 2x2
TEXT_TOKENS = 512  # the prompt's tokens in the joint sequence (image/engine.py MAX_SEQUENCE_LENGTH)
_SIZES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def _billions(n: int) -> str:
    """A parameter count in billions: "0.60", and two significant digits below 0.01 B ("0.0013", a demo model's),
    never "0.00"."""
    if n >= 1e7 or n <= 0:
        return f"{n / 1e9:.2f}"
    return f"{float(f'{n / 1e9:.2g}'):.9f}".rstrip("0")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parameter_counts(folder: Path, kind: str = "image") -> dict[str, int]:
    """Parameters per component, summed from the safetensors headers of every weight file."""
    counts: dict[str, int] = {}
    for component, files in weight_files(folder, kind).items():
        total = 0
        for path in files:
            total += sum(math.prod(shape) for _, shape in tensor_shapes(path).values())
        counts[component or "model"] = total
    return counts


def _config(folder: Path, rel: str) -> dict:
    try:
        config = json.loads((Path(folder) / rel).read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def vae_upcast(folder: Path) -> bool:
    """Whether the pipeline's VAE config asks to decode in float32 (``force_upcast: true``)."""
    return bool(_config(folder, "vae/config.json").get("force_upcast", False))


@dataclass(frozen=True)
class ImageMemory:
    """Bytes the image pipeline needs at one dtype and decode dtype."""

    dtype: torch.dtype
    parameters: int
    weights: int
    decode: int
    activations: int
    overhead: int
    size_label: str
    references: int = 0  # bytes of the reference tokens' activations (0 without editing)
    reference_tokens: int = 0
    upcast: bool = False  # the VAE decodes in float32 (force_upcast kept)
    attention: int = 0  # bytes of the largest edit slot's attention scores, were they materialised

    @property
    def total(self) -> int:
        return self.weights + self.decode + self.activations + self.overhead + self.references + self.attention

    @property
    def decode_dtype(self) -> torch.dtype:
        return torch.float32 if self.upcast else self.dtype

    def text(self) -> str:
        common = dict(total=_gib(self.total), dtype=_name(self.dtype), params=_billions(self.parameters),
                      weights=_gib(self.weights), size=self.size_label, decode_dtype=_name(self.decode_dtype),
                      decode=_gib(self.decode), rest=_gib(self.activations + self.overhead))
        if self.references and self.attention:
            return tr("needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + decoding {size} "
                      "in {decode_dtype} {decode} GiB + {tokens} reference tokens {references} GiB + the largest "
                      "edit slot's attention scores {attention} GiB + activations and overhead {rest} GiB)",
                      tokens=self.reference_tokens, references=_gib(self.references),
                      attention=_gib(self.attention), **common)
        if self.references:
            return tr("needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + decoding {size} "
                      "in {decode_dtype} {decode} GiB + {tokens} reference tokens {references} GiB + activations "
                      "and overhead {rest} GiB)", tokens=self.reference_tokens, references=_gib(self.references),
                      **common)
        return tr("needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + decoding {size} in "
                  "{decode_dtype} {decode} GiB + activations and overhead {rest} GiB)", **common)


def estimate_image(folder: Path, dtype: torch.dtype, sizes, on_cpu: bool, references: int = 0,
                   upcast: bool | None = None, shards: int = 1) -> ImageMemory:
    """What loading the pipeline in ``folder`` at ``dtype`` and decoding the largest of ``sizes`` needs, with
    up to ``references`` reference images, the decode in float32 if ``upcast`` (None: as the VAE config says)
    and the transformer split over ``shards`` ranks."""
    counts = parameter_counts(folder, "image")
    upcast = vae_upcast(folder) if upcast is None else upcast
    bytes_of = _SIZES.get(dtype, 4)
    vae_bytes = 4 if upcast else bytes_of
    held = {name: -(-n // shards) if name == "transformer" else n for name, n in counts.items()}
    weights = sum(n * (vae_bytes if name == "vae" else bytes_of) for name, n in held.items())
    largest = max(sizes, key=lambda s: s.width * s.height)
    channels = (_config(folder, "vae/config.json").get("block_out_channels") or [128])[0]
    decode = DECODE_FACTOR * channels * largest.width * largest.height * vae_bytes
    non_vae = weights - held.get("vae", 0) * vae_bytes
    tokens = references * max(_reference_tokens(size) for size in sizes)
    sequence = max(TEXT_TOKENS + _image_tokens(size) + references * _reference_tokens(size) for size in sizes)
    scores = transformer_heads(folder) * sequence * sequence * bytes_of // shards if references else 0
    return ImageMemory(dtype, sum(counts.values()), weights, decode, int(ACTIVATION_SHARE * non_vae),
                       HOST_OVERHEAD if on_cpu else 0, largest.label,
                       TOKEN_FACTOR * transformer_width(folder) * tokens * bytes_of // shards, tokens, upcast, scores)


def _image_tokens(size) -> int:
    return (size.width // PATCH) * (size.height // PATCH)


def transformer_heads(folder: Path) -> int:
    """The transformer's attention heads from its config; 24 (FLUX.2-klein-4B's) when unreadable."""
    try:
        return int(_config(folder, "transformer/config.json")["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return 24


def _reference_tokens(size) -> int:
    """Tokens of one reference fitted for an output of ``size`` (image/references.py: at most 1024x1024)."""
    fitted = reference_size(size)
    return (fitted.width // PATCH) * (fitted.height // PATCH)


def transformer_width(folder: Path) -> int:
    """The transformer's width (heads x head dim) from its config; 3072 (FLUX.2-klein-4B's) when unreadable."""
    config = _config(folder, "transformer/config.json")
    try:
        return int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    except (KeyError, TypeError, ValueError):
        return 3072


@dataclass(frozen=True)
class ChatMemory:
    """Bytes the chat model needs at one dtype: weights, its static KV cache, activations."""

    dtype: torch.dtype
    parameters: int
    weights: int
    kv_cache: int
    activations: int
    overhead: int
    batch: int
    cache_tokens: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.overhead

    def text(self) -> str:
        return tr("needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + KV cache of {batch} x "
                  "{tokens} tokens {cache} GiB + activations and overhead {rest} GiB)", total=_gib(self.total),
                  dtype=_name(self.dtype), params=_billions(self.parameters), weights=_gib(self.weights),
                  batch=self.batch, tokens=self.cache_tokens, cache=_gib(self.kv_cache),
                  rest=_gib(self.activations + self.overhead))


def estimate_chat(folder: Path, dtype: torch.dtype, context_length: int, batch: int, prefill_tokens: int,
                  on_cpu: bool) -> ChatMemory:
    """What the chat model in ``folder`` needs at ``dtype`` with a static cache of ``context_length`` tokens
    for ``batch`` rows, prefilling ``prefill_tokens`` per forward (a chunk, or the largest bucket)."""
    parameters = sum(parameter_counts(folder, "chat").values())
    config = _config(folder, "config.json")
    bytes_of = _SIZES.get(dtype, 4)
    layers, heads = int(config.get("num_hidden_layers", 0)), int(config.get("num_attention_heads", 1))
    head_dim = int(config.get("head_dim") or int(config.get("hidden_size", 0)) // max(heads, 1))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    kv_cache = 2 * layers * kv_heads * head_dim * context_length * batch * bytes_of
    weights = parameters * bytes_of
    logits = batch * prefill_tokens * int(config.get("vocab_size", 0)) * 4
    return ChatMemory(dtype, parameters, weights, kv_cache, int(ACTIVATION_SHARE * weights) + logits,
                      HOST_OVERHEAD if on_cpu else 0, batch, context_length)


def free_bytes(kind: str, core: int | None, runtime_core: int | None = None) -> int | None:
    """Free memory of a device kind ("cpu", "cuda", "neuron") and core, or None when it cannot be told.

    ``runtime_core``: the Neuron runtime's index of ``core`` (``Placement.runtime_core``), by which its
    total is asked; the allocator's count takes PyTorch's index. None: the same index.
    """
    try:
        if kind == "cpu":
            import psutil

            return int(psutil.virtual_memory().available)
        if kind == "cuda":
            return int(torch.cuda.mem_get_info(core or 0)[0])
        if kind == "neuron":
            index = core or 0
            total = int(torch.neuron.get_device_properties(index if runtime_core is None else runtime_core)
                        .total_memory)
            # 0 is TorchNeuron's answer when the runtime's query fails (a core this process does not hold)
            return total - int(torch.neuron.memory_allocated(index)) if total > 0 else None
    except Exception:  # noqa: BLE001 - an API this release lacks: unknown, reported as such
        return None
    return None


def headroom(kind: str) -> int:
    """Bytes kept free beside an estimate: none on the CPU (``HOST_OVERHEAD`` is in the estimate)."""
    return 0 if kind == "cpu" else DEVICE_HEADROOM


def where_text(kind: str, free: int) -> str:
    """'23.8 GiB free on neuron, 2.0 GiB of it kept for the runtime' (the headroom only on an accelerator)."""
    if kind == "cpu":
        return tr("{free} GiB free on {kind}", free=_gib(free), kind=kind)
    return tr("{free} GiB free on {kind}, {headroom} GiB of it kept for the runtime", free=_gib(free), kind=kind,
              headroom=_gib(headroom(kind)))


@dataclass(frozen=True)
class MemoryPlan:
    """The dtype to load with, whether the VAE decodes in float32, and what the panel says about it."""

    dtype: torch.dtype
    note: str
    upcast: bool = False
    needs: int | None = None  # bytes of the chosen way (the estimate's total)


def plan_image(folder: Path, dtype: torch.dtype, dtype_flag: str, sizes, kind: str, free: int | None,
               references: int = 0, shards: int = 1) -> MemoryPlan:
    """The first of these that fits in ``free`` bytes less the headroom: ``dtype`` as the VAE config asks;
    ``dtype`` with the decode in ``dtype`` too (when the config asks for float32); with ``--dtype auto``,
    bfloat16 in the same two ways (arguments as ``estimate_image``). Raises NotEnoughMemory, whose message
    has the numbers and only the changes that would fit."""
    on_cpu, upcast = kind == "cpu", vae_upcast(folder)

    def ways(d: torch.dtype, n: int = shards) -> list[ImageMemory]:
        first = estimate_image(folder, d, sizes, on_cpu, references, upcast, n)
        return [first] + ([estimate_image(folder, d, sizes, on_cpu, references, False, n)]
                          if upcast and d != torch.float32 else [])

    own = ways(dtype)
    wanted = own[0]
    if free is None:
        return MemoryPlan(dtype, tr("{needs}; free memory on {kind} unknown, not checked",
                                    needs=wanted.text(), kind=kind), upcast, wanted.total)
    where = where_text(kind, free)

    def fitting(estimates: list[ImageMemory]) -> ImageMemory | None:
        return next((e for e in estimates if e.total + headroom(kind) <= free), None)

    chosen = fitting(own)
    if chosen is wanted:
        return MemoryPlan(dtype, tr("{needs}; {where}", needs=wanted.text(), where=where), upcast, wanted.total)
    if chosen is not None:  # the decode in the pipeline's dtype, as Flux2KleinPipeline itself runs it
        return MemoryPlan(dtype, tr("{needs}, more than the {where}: decoding in {dtype} instead of float32 (the "
                                    "VAE config's force_upcast), as Flux2KleinPipeline does, which {half}",
                                    needs=wanted.text(), where=where, dtype=_name(dtype), half=chosen.text()), False,
                          chosen.total)
    half = fitting(ways(torch.bfloat16)) if dtype != torch.bfloat16 else None
    if dtype_flag == "auto" and half is not None:
        return MemoryPlan(torch.bfloat16, tr("{needs}, more than the {where}: loading in bfloat16 instead, which "
                                             "{half}", needs=wanted.text(), where=where, half=half.text()),
                          half.upcast, half.total)
    unscored = _without_scores(own if dtype_flag != "auto" or dtype == torch.bfloat16 else own + ways(torch.bfloat16),
                               fitting)
    if unscored is not None:  # only the edit slot's attention scores, if materialised, do not fit
        return MemoryPlan(unscored.dtype, tr(
            "{needs}, more than the {where}, if attention materialises the largest edit slot's scores ({attention} "
            "GiB; whether it does on this device is not known). Loading anyway: without them it {fits}; an edit "
            "slot that runs out of memory at warm-up fails alone, with what to do, and the other shapes serve.",
            needs=wanted.text(), where=where, attention=_gib(wanted.attention), fits=unscored.text()),
            unscored.upcast, unscored.total)
    advice = tr("--no-image, or smaller --sizes") if not references else \
        tr("--no-image, or smaller --sizes, or fewer --references")
    sharded = fitting(ways(torch.bfloat16 if half is not None else dtype, 2)[-1:]) \
        if kind != "cpu" and shards == 1 else None
    if sharded is not None:
        advice = tr("{advice}, or shard the transformer over two cores (torchrun --nproc_per_node=2 app.py --tp 2 "
                    "--tp-engine image; each rank then {sharded})", advice=advice, sharded=sharded.text())
    if half is not None:
        advice = tr("--dtype bfloat16 (which {half}), {advice}", half=half.text(), advice=advice)
    raise NotEnoughMemory(tr("The image model {needs}, more than the {where}. Pass {advice}; or free memory and "
                             "restart.", needs=own[-1].text(), where=where, advice=advice))


def _without_scores(estimates: list[ImageMemory], fitting) -> ImageMemory | None:
    """The first of ``estimates`` that fits once the edit slot's attention scores are left out (None: none)."""
    return fitting([dataclasses.replace(e, attention=0) for e in estimates if e.attention])


class NotEnoughMemory(Exception):
    """The pipeline does not fit; the message has the numbers and the flags to change."""
