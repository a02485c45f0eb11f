"""Why the compiled decode was slower than eager: the attention copied the cache once per query-head group.

Qwen3-0.6B's layer shapes (hidden 1024, 16 query heads over 8 KV heads, head_dim 128), cut to ``--layers``
layers with a 4096-token vocabulary so that the cache, not the LM head, is what a step reads most of;
bf16, CPU, inductor standing in for the neuron backend, random weights. One static cache of ``--cache``
tokens (no windows: every step attends over all of it), a 64-token prompt, greedy decode.

Three sides, each its own copy of the model, interleaved (``common.interleaved``):
- ``eager``: transformers' SDPA attention, not compiled (it packs a one-token query's heads onto their KV
  heads: ``pack_gqa``);
- ``compiled, transformers' sdpa``: the same attention under torch.compile, where transformers repeats the
  keys and values once per group instead (``repeat_kv``), materialised by the graph;
- ``compiled, engine's attention``: ``static_cache.packed_decode_sdpa``, the attention the engine gives
  its compiled forward (packed in the graph too).

In bf16 a compiled graph rounds differently from eager ops (fused kernels), so a greedy reply of random
weights may part from the eager one after a few tokens on both compiled sides; the table says whether
each side's tokens are eager's and the compiled sdpa's (token-for-token parity in float32 is
``tests/core/test_prefill_parity.py``).

A step's time is (time of a reply of ``4 + n`` tokens - time of a reply of 4) / n, so the prefill and the
first steps cancel out. Bytes: the minimum a step reads is every weight once plus the cache's keys and
values once; with ``repeat_kv`` each layer also writes the keys and values at ``groups`` times their size
and attention reads that copy: 1 + 2 * groups times the cache's bytes. The ceiling is bytes / the host's
read bandwidth (best ``sum()`` over 1 GiB, same threads), measured before and after.

Usage: ``python bench/decode_attention.py [--quick] [--layers 4] [--cache 4096] [--repeats 3]``.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common  # noqa: E402
from prefill import read_bandwidth  # noqa: E402

PROMPT, SHORT = 64, 4


def make_models(layers: int):
    """Three copies of one random model: transformers' sdpa (eager and compiled) and the engine's attention."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from neuron_backend.chat.static_cache import use_compiled_attention

    shapes = dict(common.QWEN3_06B, num_hidden_layers=layers, vocab_size=4096, max_position_embeddings=8192)
    config = Qwen3Config(**shapes, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         dtype="bfloat16")
    torch.manual_seed(0)
    plain = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    engine = copy.deepcopy(plain)
    use_compiled_attention(engine, static_masks=False)
    return {"eager": (plain, False), "compiled, transformers' sdpa": (copy.deepcopy(plain), True),
            "compiled, engine's attention": (engine, True)}


def reply(model, compiled: bool, cache_len: int, new: int) -> tuple[float, list[int]]:
    """Seconds of one greedy reply of ``new`` tokens to the fixed prompt, and its tokens."""
    import torch
    from transformers import GenerationConfig, StaticCache
    from transformers.generation.configuration_utils import CompileConfig

    config = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
    if compiled:
        config.compile_config = CompileConfig(backend="inductor", fullgraph=True, dynamic=False, mode="default")
        config.compile_config._compile_all_devices = True  # generate() compiles on CPU too (as the engine does)
    else:
        config.disable_compile = True
    prompt = torch.arange(10, 10 + PROMPT).unsqueeze(0)
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompt, generation_config=config, past_key_values=StaticCache(
            config=model.config, max_cache_len=cache_len))
    return time.perf_counter() - started, out[0, PROMPT:].tolist()


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; quick 2)")
    p.add_argument("--cache", type=int, default=4096, help="static cache tokens (default 4096)")
    p.add_argument("--new-tokens", type=int, default=None, help="timed decode steps (default 32; quick 16)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 3; quick 2)")
    args = p.parse_args()
    layers = args.layers or (2 if args.quick else 4)
    steps = args.new_tokens or (16 if args.quick else 32)
    repeats = args.repeats or (2 if args.quick else 3)
    common.set_threads(args.threads)
    import torch

    from neuron_backend.compile_cache import CompileCounter

    bandwidth = [read_bandwidth(args.threads)]
    models = make_models(layers)
    answers = {}
    for name, (model, compiled) in models.items():  # compiles the decode graph (untimed)
        answers[name] = reply(model, compiled, args.cache, SHORT + steps)[1]
    graphs = CompileCounter.graphs()

    def side(name: str):
        model, compiled = models[name]
        short, _ = reply(model, compiled, args.cache, SHORT)
        long, tokens = reply(model, compiled, args.cache, SHORT + steps)
        return {"step_s": (long - short) / steps, "same": tokens == answers["eager"],
                "same_compiled": tokens == answers["compiled, transformers' sdpa"]}

    runs = common.interleaved({name: (lambda n=name: side(n)) for name in models}, repeats, warmups=0)
    bandwidth.append(read_bandwidth(args.threads))
    bw = max(bandwidth)
    compiled_after = CompileCounter.graphs() - graphs

    plain = models["eager"][0]
    weights, kv = common.bytes_per_token(plain, args.cache)
    groups = plain.config.num_attention_heads // plain.config.num_key_value_heads
    moved = {"eager": weights + kv, "compiled, transformers' sdpa": weights + (1 + 2 * groups) * kv,
             "compiled, engine's attention": weights + kv}
    ceiling = bw / (weights + kv)
    eager_s = common.median([r["step_s"] for r in runs["eager"]])
    rows = []
    for name, results in runs.items():
        step = common.median([r["step_s"] for r in results])
        rows.append([name, f"{step * 1000:.1f}", common.spread([r["step_s"] * 1000 for r in results]),
                     f"{1 / step:.1f}", f"{step / eager_s:.2f}", f"{(1 / step) / ceiling:.2f}",
                     f"{moved[name] / (weights + kv):.2f}", "yes" if all(r["same"] for r in results) else "no",
                     "yes" if all(r["same_compiled"] for r in results) else "no"])
    common.report("Decode attention: compiled vs eager over a static cache", {
        "model": f"Qwen3-0.6B layer shapes, {layers} layers, vocab 4096, bf16, random weights",
        "cache": f"{args.cache} tokens, no windows; prompt {PROMPT}, {steps} timed steps, greedy",
        "bytes per step (minimum)": f"{(weights + kv) / 1e6:.1f} MB: weights {weights / 1e6:.1f}, "
                                    f"keys and values {kv / 1e6:.1f}",
        "host read bandwidth": f"{bw / 1e9:.1f} GB/s (before / after: "
                               f"{' / '.join(f'{b / 1e9:.1f}' for b in bandwidth)}); ceiling {ceiling:.1f} tok/s",
        "graphs compiled during the timed runs": str(compiled_after),
        "torch threads": str(torch.get_num_threads()),
    }, [("Per side (median of the repeats; range in brackets):", common.table(
        ["side", "ms/step", "range", "tok/s", "/ eager", "of ceiling", "bytes moved / minimum",
         "same tokens as eager", "as compiled sdpa"], rows))])


if __name__ == "__main__":
    main()
