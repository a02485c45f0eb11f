"""Cache windows: one chat user with the declared KV-cache windows vs attending over the whole cache.

Two ``Backend``s load the full-size Qwen3-0.6B architecture (random bf16 weights, see
``common.ensure_full_size_chat``) with the same settings except ``--cache-windows``: the full
preset's windows (512, 1024, 2048, then the 4096-token cache) against ``none`` (every step attends
over all 4096 positions, as a plain ``StaticCache`` does). The same greedy replies run on both,
interleaved, the order flipped each repeat; both must give the same number of tokens (checked).
Eager CPU, where attention cost is proportional to the positions read, as it is for a compiled
graph's memory traffic on an accelerator.
Usage: ``python bench/cache_windows.py [--quick] [--new-tokens 64] [--repeats 3]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from chat_batch import BUCKETS, CONTEXT, MESSAGES, load_backend, timed_reply  # noqa: E402


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=None, help="new tokens per reply (default 64; quick 8)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 3; quick 1)")
    args = p.parse_args()
    new_tokens = args.new_tokens or (8 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 3)
    common.set_threads(args.threads)
    import time

    windowed, warm_w = load_backend(args.root, 1, new_tokens, "off")
    whole, warm_n = load_backend(args.root, 1, new_tokens, "off", "--cache-windows", "none")
    engines = {"windows": windowed.engine("chat"), "whole cache": whole.engine("chat")}

    def side(engine):
        def run() -> dict:
            replies = [timed_reply(engine, m, new_tokens, time.perf_counter()) for m in MESSAGES[:2]]
            return {"ttft_s": common.median([r["ttft_s"] for r in replies]),
                    "tok_s": common.median([(r["tokens"] - 1) / (r["end"] - r["first"]) for r in replies])}
        return run

    results = common.interleaved({name: side(e) for name, e in engines.items()}, repeats, warmups=0)
    med = {name: {k: common.median([r[k] for r in runs]) for k in ("ttft_s", "tok_s")}
           for name, runs in results.items()}
    rows = [[name, f"{m['ttft_s']:.2f}", common.spread([r["ttft_s"] for r in results[name]]), f"{m['tok_s']:.2f}",
             common.spread([r["tok_s"] for r in results[name]])] for name, m in med.items()]
    w, n = med["windows"], med["whole cache"]
    common.report("Cache windows", {
        "model": "Qwen3-0.6B architecture, random weights, bf16, eager, CPU, batch 1",
        "windows": f"{engines['windows']._windows()} vs {engines['whole cache']._windows()}",
        "prompts": f"2 first turns per run, left-padded to bucket {BUCKETS}; static cache {CONTEXT} tokens",
        "generation": f"greedy, {new_tokens} new tokens every reply (checked): every step in window "
                      f"{engines['windows']._windows()[0]}",
        "repeats": f"{repeats} per side, interleaved, order flipped each repeat; medians",
        "threads": args.threads,
        "warm-up": f"windows {warm_w:.1f} s; whole cache {warm_n:.1f} s",
    }, [
        ("Per side:", common.table(["side", "TTFT s", "range", "decode tok/s", "range"], rows)),
        ("Ratios (same run):", common.table(["ratio", "value"], [
            ["decode tok/s: windows / whole cache", f"{w['tok_s'] / n['tok_s']:.2f}"],
            ["TTFT: windows / whole cache", f"{w['ttft_s'] / n['ttft_s']:.2f}"]])),
    ])


if __name__ == "__main__":
    main()
