"""Compiling the decoder layer once (--chat-compile-layers-once) vs the whole model's layers one by one.

Qwen3-0.6B's layer shapes cut to ``--layers`` layers (vocabulary 4096), bf16, CPU, inductor standing in
for the neuron backend, random weights, a static cache of 512 tokens and the engine's compiled attention
(``static_cache.use_compiled_attention``). Each run is a fresh process with empty compile caches (dynamo's,
inductor's FX graph cache off, its C++ kernel cache in a new folder), so the first compiled call is a cold
compile:

- ``whole``: generate()'s compiled decode as the engine runs it by default: dynamo inlines every layer
  and inductor compiles each one's code;
- ``layers once``: ``static_cache.compile_layers_once``: the layer is a nested compile region, traced and
  compiled once and called for every layer inside the same whole-model graph.

Per run: the seconds of the first reply (a 64-token prompt, 3 tokens: the eager prefill and the decode
graph's cold compile), then the decode step ((time of a 36-token reply - time of a 4-token one) / 32).
The sides alternate, the order flipped each repeat. Usage:
``python bench/compile_layers_once.py [--quick] [--layers 12] [--repeats 2]``.
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


def child(side: str, layers: int, threads: int) -> dict:
    """One cold run of ``side`` in this process (called in a fresh subprocess)."""
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM, StaticCache
    from transformers.generation.configuration_utils import CompileConfig

    from neuron_backend.chat.static_cache import compile_layers_once, use_compiled_attention

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


def run_side(side: str, layers: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, __file__, "--child", side, "--layers", str(layers),
                              "--threads", str(threads)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 12; quick 4)")
    p.add_argument("--repeats", type=int, default=None, help="cold runs per side (default 2; quick 1)")
    p.add_argument("--child", default=None, help=argparse_hidden())
    args = p.parse_args()
    layers = args.layers or (4 if args.quick else 12)
    if args.child:
        print(json.dumps(child(args.child, layers, args.threads)))
        return
    repeats = args.repeats or (1 if args.quick else 2)
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
