"""Many chat users: N concurrent replies in one batch (``--chat-batch N``) vs the same N served one after another.

The model is the full-size Qwen3-0.6B architecture with random bf16 weights (built once under the
bench root with the tiny demo tokenizer, see ``common.ensure_full_size_chat``). Two ``Backend``s
load it and warm it up like the app does: one with ``--chat-batch 1`` (today's path) and one with
``--chat-batch N``. Three sides run interleaved, the order flipped on every repeat:

- one after another (batch 1): the N requests on the batch-1 engine, each sent when the previous
  one ended. Each request's TTFT here is the single-user figure;
- N concurrent (batch N): the same N requests sent at once from N threads to the batch-N engine;
- 1 alone (batch N): one request alone on the batch-N engine (N-1 padding rows): what the fixed
  batch costs a lone user.

Aggregate tokens/s = all new tokens / wall time from the first call to the last reply's end.
TTFT = call to the first streamed update, as each caller sees it (gather window and prefill
included). Every reply must have exactly ``--new-tokens`` tokens (checked: the model cannot emit
EOS). Compiles are counted over the timed runs (dynamo's unique graphs; 0 in eager mode, where no
graph is compiled at all: pass ``--compile on`` to measure the inductor-compiled decode graph).
Usage: ``python bench/chat_batch.py [--quick] [--users 4] [--new-tokens 24] [--repeats 2] [--compile on]``.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# First-turn questions, 44-59 tokens with the template: all in the full preset's smallest bucket (64).
MESSAGES = (
    "Tell me about the tiny chip and its graph cache.",
    "Why do static shapes help a compiler?",
    "Write two lines about a quiet river at night.",
    "What is a key-value cache, in one short paragraph?",
    "Name three uses of a small language model.",
    "How does left padding keep a batch aligned?",
    "Explain a token bucket to a new engineer.",
    "Which is faster, one big batch or many small ones?",
)
BUCKETS, CONTEXT = "64", 4096  # the full preset's smallest bucket and its context length


def load_backend(root: Path, batch: int, new_tokens: int, compile_mode: str, *extra: str):
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    from tools.chat_batch import plugin as chat_batch

    folder = common.ensure_full_size_chat(root)
    settings = parse_settings(["--models", "full", "--chat-model", str(folder), "--no-image", "--device", "cpu",
                               "--dtype", "bfloat16", "--compile", compile_mode, "--chat-buckets", BUCKETS,
                               "--context-length", str(CONTEXT), "--max-new-tokens", str(max(new_tokens, 64)),
                               "--chat-batch", str(batch), "--cache-dir", str(root / "chat-batch"), *extra], env={},
                              plugins=(chat_batch,))
    backend = Backend(settings, parts=chat_batch.plug(settings))  # the batch plug-in, as app.py has it
    return backend, common.run_warm_up(backend)


def timed_reply(engine, message: str, new_tokens: int, start: float) -> dict:
    """Stream one greedy reply; TTFT and end are measured from ``start`` (the caller's send time)."""
    from neuron_backend.chat.text import ChatRequest

    first = final = None
    for update in engine.stream(ChatRequest(message, greedy=True, max_new_tokens=new_tokens)):
        first = first or time.perf_counter()
        final = update
    s = final.stats
    if s.new_tokens != new_tokens or first is None:
        raise RuntimeError(f"expected {new_tokens} new tokens, got {s.new_tokens} ({s.finish_reason})")
    return {"ttft_s": first - start, "first": first, "end": time.perf_counter(), "tokens": s.new_tokens,
            "bucket": s.bucket, "batch": s.batch_size, "graphs": s.compiled_graphs}


def make_sides(single, batched, users: int, new_tokens: int) -> dict:
    from neuron_backend.devices import CompileCounter

    messages = MESSAGES[:users]

    def summary(start: float, replies: list[dict], graphs_before: int, sequential: bool = False) -> dict:
        end = max(r["end"] for r in replies)
        # decode: the tokens after each first token, over the time some reply was decoding
        busy = sum(r["end"] - r["first"] for r in replies) if sequential else end - min(r["first"] for r in replies)
        return {"agg_tok_s": sum(r["tokens"] for r in replies) / (end - start), "wall_s": end - start,
                "decode_tok_s": sum(r["tokens"] - 1 for r in replies) / busy,
                "ttfts": [r["ttft_s"] for r in replies], "buckets": {r["bucket"] for r in replies},
                "batch": {r["batch"] for r in replies},
                "graphs": CompileCounter.graphs() - graphs_before + sum(r["graphs"] for r in replies)}

    def one_after_another() -> dict:
        graphs, start, replies = CompileCounter.graphs(), time.perf_counter(), []
        for message in messages:
            replies.append(timed_reply(single, message, new_tokens, time.perf_counter()))
        return summary(start, replies, graphs, sequential=True)

    def concurrent() -> dict:
        graphs, replies, errors = CompileCounter.graphs(), [], []
        barrier = threading.Barrier(users + 1)

        def user(message: str) -> None:
            barrier.wait()
            try:
                replies.append(timed_reply(batched, message, new_tokens, time.perf_counter()))
            except Exception as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=user, args=(m,)) for m in messages]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return summary(start, replies, graphs)

    def alone() -> dict:
        graphs, start = CompileCounter.graphs(), time.perf_counter()
        return summary(start, [timed_reply(batched, messages[0], new_tokens, start)], graphs)

    return {"one after another (batch 1)": one_after_another, f"{users} concurrent (batch {users})": concurrent,
            f"1 alone (batch {users})": alone}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=4, help="concurrent users = --chat-batch (default 4)")
    p.add_argument("--new-tokens", type=int, default=None, help="new tokens per reply (default 24; quick 8)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 2; quick 1)")
    p.add_argument("--compile", choices=("off", "on"), default="off",
                   help="on: inductor-compiled decode graph (adds minutes of warm-up)")
    args = p.parse_args()
    if not 2 <= args.users <= len(MESSAGES):
        raise SystemExit(f"--users must be 2 to {len(MESSAGES)}")
    new_tokens = args.new_tokens or (8 if args.quick else 24)
    repeats = args.repeats or (1 if args.quick else 2)
    common.set_threads(args.threads)
    single_backend, single_warm = load_backend(args.root, 1, new_tokens, args.compile)
    batched_backend, batched_warm = load_backend(args.root, args.users, new_tokens, args.compile)
    single, batched = single_backend.engine("chat"), batched_backend.engine("chat")
    from neuron_backend.devices import CompileCounter

    graphs_at_ready = CompileCounter.graphs()  # both warm-ups done
    sides = make_sides(single, batched, args.users, new_tokens)
    names = list(sides)

    def progress(name, i, r):
        print(f"  repeat {i + 1} {name}: {r['agg_tok_s']:.2f} tok/s aggregate, TTFT "
              + ", ".join(f"{t:.2f}" for t in r["ttfts"]) + " s", file=sys.stderr)

    results = common.interleaved(sides, repeats, warmups=0, on_result=progress)  # the Backends warmed up
    med = {name: {"agg": common.median([r["agg_tok_s"] for r in runs]),
                  "wall": common.median([r["wall_s"] for r in runs]),
                  "decode": common.median([r["decode_tok_s"] for r in runs]),
                  "ttft": common.median([t for r in runs for t in r["ttfts"]]),
                  "ttft_max": common.median([max(r["ttfts"]) for r in runs]),
                  "graphs": sum(r["graphs"] for r in runs)} for name, runs in results.items()}
    rows = []
    for name, runs in results.items():
        m = med[name]
        rows.append([name, f"{m['agg']:.2f}", common.spread([r["agg_tok_s"] for r in runs]), f"{m['decode']:.2f}",
                     f"{m['wall']:.1f}",
                     f"{m['ttft']:.2f}", f"{m['ttft_max']:.2f}",
                     ",".join(str(b) for b in sorted(set().union(*(r["buckets"] for r in runs)))),
                     ",".join(str(b) for b in sorted(set().union(*(r["batch"] for r in runs)))), m["graphs"]])
    seq, conc, lone = (med[n] for n in names)
    agg_ratio = conc["agg"] / seq["agg"]
    ttft_ratio = conc["ttft_max"] / seq["ttft"]  # the slowest concurrent user vs a user alone today
    ttft_lone = conc["ttft_max"] / lone["ttft"]
    compiles = CompileCounter.graphs() - graphs_at_ready  # every run after warm-up, untimed ones included
    ratios = [
        ["aggregate tok/s: concurrent / one after another", f"{agg_ratio:.2f}", common.verdict(agg_ratio, 2.5, True)],
        ["decode tok/s (after the first tokens): concurrent / one after another",
         f"{conc['decode'] / seq['decode']:.2f}", "(no target: the batching gain without the prefill)"],
        ["TTFT: slowest concurrent user / a user alone on batch 1", f"{ttft_ratio:.2f}",
         common.verdict(ttft_ratio, 1.5, False)],
        [f"TTFT: slowest concurrent user / a user alone on batch {args.users}", f"{ttft_lone:.2f}",
         common.verdict(ttft_lone, 1.5, False)],
        ["compiles after warm-up (all runs, both engines)", str(compiles), common.verdict(compiles, 0, False)],
    ]
    prompt_tokens = [batched.count_prompt_tokens({"message": m}).prompt_tokens for m in MESSAGES[:args.users]]
    settings = {
        "model": "Qwen3-0.6B architecture (28 layers, hidden 1024, vocab 151936, tied), random weights, bf16, "
                 f"loaded by ChatEngine.load from {common.FULL_CHAT_DIR}",
        "device / mode": f"{batched.placement.label()} ({'inductor' if args.compile == 'on' else 'eager'})",
        "users / --chat-batch": f"{args.users} / 1 and {args.users}",
        "prompts": f"{args.users} different first turns of {min(prompt_tokens)}-{max(prompt_tokens)} tokens, "
                   f"left-padded to bucket {BUCKETS.split(',')[0]}; static cache {CONTEXT} tokens",
        "generation": f"greedy, {new_tokens} new tokens every reply (checked)",
        "repeats": f"{repeats} timed per side after the warm-up, interleaved, order flipped each repeat; medians",
        "threads": args.threads,
        "warm-up (load + buckets)": f"batch 1: {single_warm:.1f} s; batch {args.users}: {batched_warm:.1f} s",
        "peak RSS of this process": f"{common.peak_rss_mb():.0f} MiB",
    }
    common.report("Many chat users", settings, [
        ("Per side (aggregate: all tokens / wall time; decode: tokens after the first / time decoding; "
         "TTFT: send to first update; medians):",
         common.table(["side", "aggregate tok/s", "range", "decode tok/s", "wall s", "TTFT s (median)",
                       "TTFT s (slowest user)", "bucket", "batch", "compiles"], rows)),
        ("Ratios (same run):", common.table(["ratio", "value", "target"], ratios)),
    ])


if __name__ == "__main__":
    main()
