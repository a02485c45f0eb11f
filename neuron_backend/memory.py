"""Memory before loading: what the image pipeline will need, what the device has free, which dtype fits.

The parameter count comes from the safetensors headers (each tensor's declared shape; no weight
is read), so it is exact for any checkpoint: the real FLUX.2-klein-4B pipeline holds about 8.0 B
parameters, ~30 GiB in float32 and ~15 GiB in bfloat16. On top of the weights:

- decoding: the VAE decoder's activations at the largest declared size, in float32 when the VAE
  config says ``force_upcast`` (it then stays float32 on bf16 devices). The peak is taken as
  ``DECODE_FACTOR`` times the largest decoder feature map (full resolution x
  ``block_out_channels[0]``); 15 matches the ~8 GB measured decoding 1024x1024 with the real VAE;
- ``ACTIVATION_SHARE`` of the weights for the text encoder's and transformer's activations;
- editing: each reference image adds its tokens to the transformer's sequence (as many as an output
  image of its size, image/references.py); they are counted as ``TOKEN_FACTOR`` x the transformer's
  width (heads x head dim) per token, for the most references at the largest size (1024x1024 with one
  reference on the real transformer, 3072 wide: 4096 tokens, ~0.4 GiB in bfloat16);
- on the CPU, ``HOST_OVERHEAD`` for the process itself (Python, torch, Gradio).

Free memory is asked of the placement's device: the host's available RAM on the CPU,
``mem_get_info`` on CUDA, total minus allocated of the core on Neuron. Unknown is reported, never
guessed, and then nothing is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .image.references import reference_size
from .messages import tr
from .weights import safetensors_header, weight_files

GIB = 1024**3
DECODE_FACTOR = 15
ACTIVATION_SHARE = 0.10
HOST_OVERHEAD = 1 * GIB
TOKEN_FACTOR = 16  # activations alive per token of one transformer block, in units of its width
PATCH = 16  # pixels per token side: FLUX.2's VAE downsamples by 8, the transformer patchifies 2x2
_SIZES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def parameter_counts(folder: Path, kind: str = "image") -> dict[str, int]:
    """Parameters per component, summed from the safetensors headers of every weight file."""
    counts: dict[str, int] = {}
    for component, files in weight_files(folder, kind).items():
        total = 0
        for path in files:
            for name, tensor in safetensors_header(path).items():
                if name != "__metadata__":
                    total += math.prod(tensor["shape"])
        counts[component or "model"] = total
    return counts


def vae_upcast(folder: Path) -> bool:
    """Whether the pipeline's VAE config asks to decode in float32 (``force_upcast: true``)."""
    try:
        return bool(json.loads((Path(folder) / "vae" / "config.json").read_text()).get("force_upcast", False))
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class ImageMemory:
    """Bytes the image pipeline needs at one dtype."""

    dtype: torch.dtype
    parameters: int
    weights: int
    decode: int
    activations: int
    overhead: int
    size_label: str
    references: int = 0  # bytes of the reference tokens' activations (0 without editing)
    reference_tokens: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.decode + self.activations + self.overhead + self.references

    def text(self) -> str:
        if self.references:
            return tr("needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + decoding {size} "
                      "{decode} GiB + {tokens} reference tokens {references} GiB + activations and overhead {rest} "
                      "GiB)", total=f"{self.total / GIB:.1f}", dtype=str(self.dtype).removeprefix("torch."),
                      params=f"{self.parameters / 1e9:.2f}", weights=f"{self.weights / GIB:.1f}",
                      size=self.size_label, decode=f"{self.decode / GIB:.1f}", tokens=self.reference_tokens,
                      references=f"{self.references / GIB:.1f}",
                      rest=f"{(self.activations + self.overhead) / GIB:.1f}")
        return tr("needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + decoding {size} "
                  "{decode} GiB + "
                  "activations and "
                  "overhead {rest} "
                  "GiB)", total=f"{self.total / GIB:.1f}", dtype=str(self.dtype).removeprefix("torch."),
                   params=f"{self.parameters / 1e9:.2f}", weights=f"{self.weights / GIB:.1f}", size=self.size_label,
                   decode=f"{self.decode / GIB:.1f}", rest=f"{(self.activations + self.overhead) / GIB:.1f}")


def estimate_image(folder: Path, dtype: torch.dtype, sizes, on_cpu: bool, references: int = 0) -> ImageMemory:
    """What loading the pipeline in ``folder`` at ``dtype`` and decoding the largest of ``sizes`` needs;
    ``references``: the most reference images a request may carry (``--references``)."""
    counts = parameter_counts(folder, "image")
    upcast = vae_upcast(folder)
    bytes_of = _SIZES.get(dtype, 4)
    vae_bytes = 4 if upcast else bytes_of
    weights = sum(n * (vae_bytes if name == "vae" else bytes_of) for name, n in counts.items())
    largest = max(sizes, key=lambda s: s.width * s.height)
    try:
        channels = json.loads((Path(folder) / "vae" / "config.json").read_text())["block_out_channels"][0]
    except (OSError, ValueError, KeyError, IndexError):
        channels = 128
    decode = DECODE_FACTOR * channels * largest.width * largest.height * vae_bytes
    non_vae = weights - counts.get("vae", 0) * vae_bytes
    tokens = references * max(_reference_tokens(size) for size in sizes)
    return ImageMemory(dtype, sum(counts.values()), weights, decode, int(ACTIVATION_SHARE * non_vae),
                       HOST_OVERHEAD if on_cpu else 0, largest.label,
                       TOKEN_FACTOR * transformer_width(folder) * tokens * bytes_of, tokens)


def _reference_tokens(size) -> int:
    """Tokens of one reference fitted for an output of ``size`` (image/references.py: at most 1024x1024)."""
    fitted = reference_size(size)
    return (fitted.width // PATCH) * (fitted.height // PATCH)


def transformer_width(folder: Path) -> int:
    """The transformer's width (heads x head dim) from its config; 3072 (FLUX.2-klein-4B's) when unreadable."""
    try:
        config = json.loads((Path(folder) / "transformer" / "config.json").read_text())
        return int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    except (OSError, ValueError, KeyError, TypeError):
        return 3072


def free_bytes(kind: str, core: int | None) -> int | None:
    """Free memory of a device kind ("cpu", "cuda", "neuron") and core, or None when it cannot be told."""
    try:
        if kind == "cpu":
            import psutil

            return int(psutil.virtual_memory().available)
        if kind == "cuda":
            return int(torch.cuda.mem_get_info(core or 0)[0])
        if kind == "neuron":
            index = core or 0
            total = int(torch.neuron.get_device_properties(index).total_memory)
            return total - int(torch.neuron.memory_allocated(index))
    except Exception:  # noqa: BLE001 - an API this release lacks: unknown, reported as such
        return None
    return None


@dataclass(frozen=True)
class MemoryPlan:
    """The dtype to load with, and what the panel says about it."""

    dtype: torch.dtype
    note: str


def plan_image(folder: Path, dtype: torch.dtype, dtype_flag: str, sizes, kind: str, free: int | None,
               references: int = 0) -> MemoryPlan:
    """Keep ``dtype`` when it fits in ``free`` bytes; with ``--dtype auto`` fall back to bfloat16 if that fits.
    ``references``: the most reference images a request may carry.

    Raises NotEnoughMemory, whose message has the numbers and the flags to change.
    """
    on_cpu = kind == "cpu"
    wanted = estimate_image(folder, dtype, sizes, on_cpu, references)
    if free is None:
        return MemoryPlan(dtype, tr("{needs}; free memory on {kind} unknown, not checked",
                                    needs=wanted.text(), kind=kind))
    where = tr("{free} GiB free on {kind}", free=f"{free / GIB:.1f}", kind=kind)
    if wanted.total <= free:
        return MemoryPlan(dtype, tr("{needs}; {where}", needs=wanted.text(), where=where))
    half = estimate_image(folder, torch.bfloat16, sizes, on_cpu, references)
    if dtype_flag == "auto" and dtype != torch.bfloat16 and half.total <= free:
        return MemoryPlan(torch.bfloat16, tr("{needs}, more than the {where}: loading in bfloat16 instead, which "
                                             "{half}", needs=wanted.text(), where=where, half=half.text()))
    advice = tr("--no-image, or smaller --sizes") if not references else \
        tr("--no-image, or smaller --sizes, or fewer --references")
    if dtype != torch.bfloat16 and half.total <= free:
        advice = tr("--dtype bfloat16 (which {half}), {advice}", half=half.text(), advice=advice)
    raise NotEnoughMemory(tr("The image model {needs}, more than the {where}. Pass {advice}; or free memory and "
                             "restart.", needs=wanted.text(), where=where, advice=advice))


class NotEnoughMemory(Exception):
    """The pipeline does not fit; the message has the numbers and the flags to change."""
