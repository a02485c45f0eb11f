"""Compiling a repeated part once vs the whole model: chat decoder layers, or (--image) FLUX.2 transformer blocks.

Qwen3-0.6B's layer shapes cut to ``--layers`` layers (vocabulary 4096), bf16, CPU, inductor standing in
for the neuron backend, random weights, a static cache of 512 tokens and the engine's compiled attention
(``static_cache.use_compiled_attention``). Each run is a fresh process with empty compile caches (dynamo's,
inductor's FX graph cache off, its C++ kernel cache in a new folder), so the first compiled call is a cold
compile:

- ``whole``: generate()'s compiled decode as the engine runs it by default: dynamo inlines every layer
  and inductor compiles each one's code;
- ``layers once``: ``compile_layers_once`` (bench/layers_once.py): the layer is a nested compile region,
  traced and compiled once and called for every layer inside the same whole-model graph.

Per run: the seconds of the first reply (a 64-token prompt, 3 tokens: the eager prefill and the decode
graph's cold compile), then the decode step ((time of a 36-token reply - time of a 4-token one) / 32).
The sides alternate, the order flipped each repeat. Usage:
``python bench/compile_layers_once.py [--quick] [--layers 12] [--repeats 2]``.

``--image``: the image engine's warm-up on the tiny demo FLUX.2-klein (CPU, inductor, ``--compile on``),
``whole`` (``pipe.transformer.compile``) vs ``repeated blocks`` (``--compile-repeated-blocks on``:
``compile_repeated_blocks``, one graph per block class and size). Per run: graphs and seconds of each
size's warm-up (1 step, cold caches), seconds per image after warm-up at the largest size (default steps,
median of ``IMAGE_TIMED`` images) and the image's pixels, compared across runs and sides. The tiny
transformer has 2 double and 2 single blocks; FLUX.2-klein-4B has 5 and 20, so a whole graph there holds
25 blocks against 2 block graphs. Usage: ``python bench/compile_layers_once.py --image [--repeats 2]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT = 64
IMAGE_SIZES = "64x64,128x64,128x128"
IMAGE_TIMED = 3  # images timed after warm-up, per run


def child(side: str, layers: int, threads: int) -> dict:
    """One cold run of ``side`` in this process (called in a fresh subprocess)."""
    sys.path.insert(0, str(ROOT))
    import torch
    from layers_once import compile_layers_once
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM, StaticCache
    from transformers.generation.configuration_utils import CompileConfig

    from neuron_backend.chat.static_cache import use_compiled_attention

    torch.set_num_threads(threads)
    torch._inductor.config.fx_graph_cache = False
    shapes = dict(common.QWEN3_06B, num_hidden_layers=layers, vocab_size=4096, max_position_embeddings=8192)
    config = Qwen3Config(**shapes, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         dtype="bfloat16")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    use_compiled_attention(model, static_masks=False)
    if side == "layers once":
        compile_layers_once(model)

    def reply(new: int) -> tuple[float, list[int]]:
        generation = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                                      eos_token_id=None)
        generation.compile_config = CompileConfig(backend="inductor", fullgraph=True, dynamic=False)
        generation.compile_config._compile_all_devices = True  # generate() compiles on CPU too (as the engine)
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(torch.arange(10, 10 + PROMPT).unsqueeze(0), generation_config=generation,
                                 past_key_values=StaticCache(config=config, max_cache_len=512))
        return time.perf_counter() - started, out[0, PROMPT:].tolist()

    first, _ = reply(3)
    short, _ = reply(4)
    long, tokens = reply(36)
    return {"first_s": first, "step_s": (long - short) / 32, "tokens": tokens}


def image_child(side: str, root: Path, threads: int, pixels: Path) -> dict:
    """One cold image-engine warm-up and steady state of ``side`` (called in a fresh subprocess)."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch

    from neuron_backend.devices import resolve_placements
    from neuron_backend.image.engine import ImageEngine, ImageRequest
    from neuron_backend.settings import parse_settings

    torch.set_num_threads(threads)
    torch._inductor.config.fx_graph_cache = False
    demo = common.ensure_demo_models(root)
    blocks = "on" if side == "repeated blocks" else "off"
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--compile", "on", "--sizes", IMAGE_SIZES,
                               "--compile-repeated-blocks", blocks, "--cache-dir", str(pixels.parent / side)], env={})
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "demo FLUX.2-klein (tiny)")
    engine.load(demo.image)
    for size in settings.sizes:
        engine.warm_up(size)
    size = max(settings.sizes, key=lambda s: s.width * s.height)
    seconds = []
    for _ in range(IMAGE_TIMED):
        started = time.perf_counter()
        result = engine.generate(ImageRequest("a lighthouse at dusk", size.label, seed=7))
        seconds.append(time.perf_counter() - started)
        if result.compiled_graphs:
            raise SystemExit(f"{side}: a request after warm-up compiled {result.compiled_graphs} graph(s)")
    np.save(pixels, np.asarray(result.image))
    return {"warmups": engine.describe()["warmups"], "image_s": common.median(seconds), "mode": engine._mode()}


def run_side(side: str, layers: int, threads: int, image: Path | None = None, root: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        extra = ["--image-pixels", str(image), "--root", str(root)] if image else []
        out = subprocess.run([sys.executable, __file__, "--child", side, "--layers", str(layers),
                              "--threads", str(threads), *extra], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def image_main(args, repeats: int) -> None:
    """--image: whole transformer vs repeated blocks, interleaved cold runs; prints the report."""
    import numpy as np

    common.ensure_demo_models(args.root)
    sides, work = ("whole", "repeated blocks"), Path(tempfile.mkdtemp(prefix="regional-"))
    counter = iter(range(10**6))

    def cold(side: str) -> dict:
        pixels = work / f"run{next(counter)}.npy"
        return dict(run_side(side, 0, args.threads, pixels, args.root), pixels=str(pixels))

    runs = common.interleaved({s: (lambda s=s: cold(s)) for s in sides}, repeats, warmups=0)
    images = [np.load(r["pixels"]).astype(int) for s in sides for r in runs[s]]
    diff = max(int(np.abs(a - images[0]).max()) for a in images)
    sizes = IMAGE_SIZES.split(",")
    rows = []
    for s in sides:
        first = runs[s][0]["warmups"]
        graphs = " / ".join(str(first[label]["compiled_graphs"]) for label in sizes)
        per_size = [[r["warmups"][label]["seconds"] for r in runs[s]] for label in sizes]
        totals = [sum(r["warmups"][label]["seconds"] for label in sizes) for r in runs[s]]
        image_s = [r["image_s"] for r in runs[s]]
        rows.append([s, graphs, " / ".join(f"{min(v):.2f}, {common.median(v):.2f}" for v in per_size),
                     f"{min(totals):.1f}, {common.median(totals):.1f}",
                     f"{min(image_s):.3f}, {common.median(image_s):.3f}"])
    total = {s: common.median([sum(r["warmups"][label]["seconds"] for label in sizes) for r in runs[s]])
             for s in sides}
    common.report("Compiling each repeated transformer block once vs the whole transformer (image engine)", {
        "model": "tiny demo FLUX.2-klein (2 double + 2 single blocks; the real 4B has 5 + 20), float32, CPU",
        "compile": "torch.compile inductor, fullgraph=True, dynamic=False (CPU stand-in for the neuron backend)",
        "runs": f"{repeats} cold run(s) per side, interleaved, each a fresh process with empty compile caches",
        "sizes": IMAGE_SIZES, "steady state": f"{IMAGE_TIMED} images at the largest size, default steps, seed 7",
        "warm-up s, repeated blocks / whole": f"{total['repeated blocks'] / total['whole']:.2f}",
        "max abs pixel difference, all runs and sides": str(diff),
        "torch threads": str(args.threads),
    }, [("Per side (min, median):", common.table(
        ["side", "graphs per size", "warm-up s per size", "warm-up s total", "s per image"], rows))])


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 12; quick 4)")
    p.add_argument("--repeats", type=int, default=None, help="cold runs per side (default 2; quick 1)")
    p.add_argument("--image", action="store_true", help="the image engine: whole transformer vs repeated blocks")
    p.add_argument("--child", default=None, help=argparse_hidden())
    p.add_argument("--image-pixels", type=Path, default=None, help=argparse_hidden())
    args = p.parse_args()
    layers = args.layers or (4 if args.quick else 12)
    if args.child and args.image_pixels:
        print(json.dumps(image_child(args.child, args.root, args.threads, args.image_pixels)))
        return
    if args.child:
        print(json.dumps(child(args.child, layers, args.threads)))
        return
    repeats = args.repeats or (1 if args.quick else 2)
    if args.image:
        image_main(args, repeats)
        return
    sides = ("whole", "layers once")
    runs = common.interleaved({s: (lambda s=s: run_side(s, layers, args.threads)) for s in sides}, repeats,
                              warmups=0)
    first = {s: common.median([r["first_s"] for r in runs[s]]) for s in sides}
    step = {s: common.median([r["step_s"] for r in runs[s]]) for s in sides}
    same = all(r["tokens"] == runs["whole"][0]["tokens"] for s in sides for r in runs[s])
    rows = [[s, f"{first[s]:.1f}", common.spread([r["first_s"] for r in runs[s]]), f"{step[s] * 1000:.1f}",
             common.spread([r["step_s"] * 1000 for r in runs[s]])] for s in sides]
    common.report("Compiling the decoder layer once vs every layer", {
        "model": f"Qwen3-0.6B layer shapes, {layers} layers, vocab 4096, bf16, random weights",
        "runs": f"{repeats} cold run(s) per side, each a fresh process with empty compile caches",
        "first reply s, layers once / whole": f"{first['layers once'] / first['whole']:.2f} (target <= 0.5)",
        "decode tok/s, layers once / whole": f"{step['whole'] / step['layers once']:.2f} (target >= 0.95)",
        "same tokens on both sides": "yes" if same else "no",
        "torch threads": str(args.threads),
    }, [("Per side (median; range in brackets):", common.table(
        ["side", "first reply s (cold compile)", "range", "decode ms/step", "range"], rows))])


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
