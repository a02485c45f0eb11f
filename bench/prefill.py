"""Compiled prefill on static chunks vs eager prefill, and batch-1 decode against the host's memory bandwidth.

The model is the full-size Qwen3-0.6B architecture with random bf16 weights (``common.ensure_full_size_chat``),
on CPU with inductor standing in for the neuron backend. Every side is its own ``ChatEngine`` with its own
copy of the model, warmed up bucket by bucket as the app does, in one process. Inductor's on-disk graph
cache is off for this script, but two things are still shared, so the warm-up columns read in side order:
dynamo guards on a module's structure, not its identity, so a later side whose graph is the same as an
earlier side's (same shapes, same attention function) reuses it and counts no graph; and inductor's C++
kernel cache (``TORCHINDUCTOR_CACHE_DIR``) serves kernels an earlier side (or an earlier run) compiled.

Prefill (time to first token at each bucket), two sides, interleaved, the order flipped each repeat:
- ``chunked``: ``--compile on`` (the default ``--prefill-chunk``: the smallest bucket, 64): the prompt runs
  through the compiled forward in 64-token chunks;
- ``eager prefill``: ``--compile on --prefill-chunk 0``: the prompt runs eager at the bucket's length
  (the path before this change); decode compiled on both.
Each prompt is ``bucket - 8`` tokens (left-padded to the bucket), 2 new tokens, greedy; both sides must
pick the same first token (reported).

Decode at batch 1 (a bucket-64 prompt, ``--new-tokens`` greedy tokens; the model cannot emit EOS), four
sides: eager or compiled, cache windows on (512, then the 4096-token cache: every step reads 512
positions) or off (every step reads 4096). The ceiling is this machine's limit for a step that must read
every weight once and the cache window once: bytes per token / host read bandwidth, the bandwidth
measured in the same run (the best of several ``sum()`` passes over a 1 GiB float32 array, with the same
torch thread count as the decode), before and after the decode runs.
Usage: ``python bench/prefill.py [--quick] [--repeats 2] [--new-tokens 32] [--buckets 64,256,1024]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CONTEXT, WINDOW = 4096, 512


def make_engine(root: Path, buckets: str, compile_mode: str, *extra: str):
    """A loaded ChatEngine on the full-size model; the seconds and graphs of its warm-up, per bucket."""
    from neuron_backend.chat.engine import ChatEngine
    from neuron_backend.devices import CompileCounter, HostDevices, resolve_placements
    from neuron_backend.settings import parse_settings

    folder = common.ensure_full_size_chat(root)
    settings = parse_settings(["--models", "full", "--chat-model", str(folder), "--no-image", "--device", "cpu",
                               "--dtype", "bfloat16", "--compile", compile_mode, "--chat-buckets", buckets,
                               "--context-length", str(CONTEXT), "--cache-dir", str(root / "prefill"), *extra],
                              env={})
    engine = ChatEngine(settings, resolve_placements(settings, HostDevices(0, None, 0))["chat"], "bench")
    engine.load(folder)
    warm = []
    for key in engine.shapes.keys():
        started, graphs = time.perf_counter(), CompileCounter.graphs()
        engine.warm_up(key)
        warm.append((key, time.perf_counter() - started, CompileCounter.graphs() - graphs))
    return engine, warm


def prompt(engine, length: int, bucket: int, new_tokens: int):
    from neuron_backend.chat.engine import _Prompt

    ids = engine.tokenizer(" the" * length, add_special_tokens=False)["input_ids"][:length]
    assert len(ids) == length
    return _Prompt(ids, bucket, 0, new_tokens, False)


def reply(engine, length: int, bucket: int, new_tokens: int) -> dict:
    from neuron_backend.chat.engine import ChatRequest

    request = ChatRequest("x", greedy=True, max_new_tokens=new_tokens)
    final = list(engine._run(request, prompt(engine, length, bucket, new_tokens), min_new_tokens=new_tokens))[-1]
    s = final.stats
    if s.new_tokens != new_tokens:
        raise RuntimeError(f"expected {new_tokens} new tokens, got {s.new_tokens}")
    return {"ttft_s": s.time_to_first_token_s, "tok_s": s.tokens_per_s, "graphs": s.compiled_graphs,
            "answer": final.answer}


def read_bandwidth(threads: int, gib: float = 1.0, passes: int = 5) -> float:
    """Bytes per second of the best ``sum()`` over a ``gib`` GiB float32 array (torch, ``threads`` threads)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    x.sum()  # page everything in
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - started)
    return x.numel() * 4 / best


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 2; quick 1)")
    p.add_argument("--new-tokens", type=int, default=None, help="decode tokens per reply (default 32; quick 12)")
    p.add_argument("--buckets", default=None, help="prompt buckets (default 64,256,1024; quick 64,256)")
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 2)
    new_tokens = args.new_tokens or (12 if args.quick else 32)
    buckets = args.buckets or ("64,256" if args.quick else "64,256,1024")
    common.set_threads(args.threads)
    import torch

    torch._inductor.config.fx_graph_cache = False  # every side compiles its own graphs, cold

    bandwidth = [read_bandwidth(args.threads)]
    windows = ("--cache-windows", str(WINDOW))
    sides = {  # in this order: the eager prefill pays for the decode kernels cold, the chunks for their own
        "eager prefill": make_engine(args.root, buckets, "on", *windows, "--prefill-chunk", "0"),
        "chunked": make_engine(args.root, buckets, "on", *windows),
        "compiled, whole cache": make_engine(args.root, "64", "on", "--cache-windows", "none",
                                             "--prefill-chunk", "0"),
        "eager, windows": make_engine(args.root, "64", "off", *windows),
        "eager, whole cache": make_engine(args.root, "64", "off", "--cache-windows", "none"),
    }
    engines = {name: engine for name, (engine, _) in sides.items()}

    # ----- prefill: TTFT per bucket
    bucket_list = engines["chunked"].buckets
    prefill_sides = {}
    for bucket in bucket_list:
        for name in ("chunked", "eager prefill"):
            prefill_sides[f"{name}@{bucket}"] = (lambda e=engines[name], b=bucket: reply(e, b - 8, b, 2))
    ttft = common.interleaved(prefill_sides, repeats, warmups=0)

    # ----- decode at batch 1, windows on and off
    decode_names = {"compiled, windows": "chunked", "compiled, whole cache": "compiled, whole cache",
                    "eager, windows": "eager, windows", "eager, whole cache": "eager, whole cache"}
    decode = common.interleaved({label: (lambda e=engines[name]: reply(e, 56, 64, new_tokens))
                                 for label, name in decode_names.items()}, repeats, warmups=0)
    bandwidth.append(read_bandwidth(args.threads))
    bw = max(bandwidth)

    warm_rows = []
    for name, (engine, warm) in sides.items():
        per_bucket = ", ".join(f"{k.tokens}: {g} in {s:.0f} s" for k, s, g in warm)
        warm_rows.append([name, engine.prefill_chunk or "eager", sum(g for _, _, g in warm),
                          f"{sum(s for _, s, _ in warm):.0f}", per_bucket])
    ttft_rows = []
    for bucket in bucket_list:
        c, e = (ttft[f"{n}@{bucket}"] for n in ("chunked", "eager prefill"))
        mc, me = common.median([r["ttft_s"] for r in c]), common.median([r["ttft_s"] for r in e])
        same = all(a["answer"] == b["answer"] for a, b in zip(c, e, strict=True))
        ttft_rows.append([bucket, f"{me:.2f}", common.spread([r["ttft_s"] for r in e]), f"{mc:.2f}",
                          common.spread([r["ttft_s"] for r in c]), f"{mc / me:.2f}", "yes" if same else "no"])
    decode_rows = []
    for label, runs in decode.items():
        engine = engines[decode_names[label]]
        window = engine._windows()[0]
        weights, kv = common.bytes_per_token(engine.model, window)
        ceiling = bw / (weights + kv)
        tok_s = common.median([r["tok_s"] for r in runs])
        decode_rows.append([label, window, f"{(weights + kv) / 1e9:.3f}", f"{ceiling:.2f}", f"{tok_s:.2f}",
                            common.spread([r["tok_s"] for r in runs]), f"{tok_s / ceiling:.2f}"])
    graphs_after = sum(r["graphs"] for runs in (*ttft.values(), *decode.values()) for r in runs)
    common.report("Compiled prefill chunks and decode against the bandwidth limit", {
        "model": "Qwen3-0.6B architecture, random weights, bf16, CPU, inductor (fullgraph, dynamic=False)",
        "shapes": f"buckets {buckets}; static cache {CONTEXT} tokens; windows ({WINDOW}, {CONTEXT}) or none",
        "prefill": "prompt = bucket - 8 tokens, 2 new tokens, greedy",
        "decode": f"batch 1, bucket-64 prompt of 56 tokens, {new_tokens} greedy new tokens",
        "repeats": f"{repeats} per side, interleaved, order flipped each repeat; medians",
        "threads": args.threads,
        "host read bandwidth": f"{bw / 1e9:.1f} GB/s (best sum() over 1 GiB float32, {args.threads} threads; "
                               f"before / after: {' / '.join(f'{b / 1e9:.1f}' for b in bandwidth)})",
        "graphs compiled during the timed runs": graphs_after,
    }, [
        ("Warm-up per side (graphs compiled, cold):",
         common.table(["side", "prefill chunk", "graphs", "warm-up s", "per bucket"], warm_rows)),
        ("Time to first token:", common.table(
            ["bucket", "eager prefill s", "range", "chunked s", "range", "chunked / eager", "same token"],
            ttft_rows)),
        ("Decode at batch 1 against the bandwidth ceiling:", common.table(
            ["side", "window", "GB read per token", "ceiling tok/s", "tok/s", "range", "fraction of ceiling"],
            decode_rows)),
    ])


if __name__ == "__main__":
    main()
