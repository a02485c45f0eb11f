"""Chat overhead: our chat engine (and the app's streaming HTTP API) vs raw model.generate, same model.

The model is the full-size Qwen3-0.6B architecture with random bf16 weights (built once under the
bench root with the tiny demo tokenizer, see ``common.ensure_full_size_chat``), loaded through
``Backend`` / ``ChatEngine.load`` and warmed up like the app does. Three sides share that one model
object and run one after the other, interleaved (the order rotated and reversed from repeat to
repeat, so each side follows each other side equally often; a 1 s pause before each run):

- raw: ``model.generate`` the documented way (the same left-padded ids, ``cache_implementation=
  "static"`` with ``max_cache_len`` of the context length, greedy, no compile; transformers 5.24
  builds a new static cache on every such call, while the engine keeps one and resets it) and a
  minimal streamer that only notes
  when the first new token arrived, called from a long-lived thread of its own;
- engine: ``ChatEngine.stream`` (worker thread, text streamer, think splitter, cancel check);
- http: ``gradio_client`` streaming ``/chat`` from the app (``create_demo``) served in this process.

Every run must produce exactly ``--new-tokens`` tokens (checked): the model cannot emit EOS (its
embedding row is scaled down), so no side needs ``min_new_tokens`` (the engine's API has no such
knob, and its logits processor would add work to one side only). Time to first token (TTFT) is
measured where each caller sees it; decode tokens/s is (N - 1) / (done - first token).

Then the same three sides run on the tiny demo model, where a token costs ~2 ms of compute, so
the time each layer adds per token (and to the first token) stands out of the machine's noise.
The engine runs with ``--cache-windows none`` so that both sides attend over the whole static cache,
the same work: this measures what the engine adds. What the cache windows save is measured by
``bench/cache_windows.py``. On CPU the prefill's speed depends on the malloc arena of the thread that
runs generate(); the app sets glibc to one arena on CPU (``devices.limit_malloc_arenas``, which
``Backend`` calls), so both sides here share it.
Usage: ``python bench/chat_overhead.py [--quick] [--new-tokens 32] [--repeats 7] [--no-tiny]`` (~6 min).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MESSAGE = "Tell me about the tiny chip and its graph cache."
# A 64-token bucket keeps the (eager, CPU) prefill short so more repeats fit; the context is the full preset's.
BUCKETS, CONTEXT = "64,256", 4096
TINY_TOKENS = 64
SETTLE_S = 1.0  # pause before each timed run: the HTTP side's client and server finish their bookkeeping


def load_backend(root: Path, new_tokens: int):
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings

    folder = common.ensure_full_size_chat(root)
    settings = parse_settings(["--models", "full", "--chat-model", str(folder), "--no-image", "--device", "cpu",
                               "--dtype", "bfloat16", "--compile", "off", "--chat-buckets", BUCKETS,
                               "--context-length", str(CONTEXT), "--max-new-tokens", str(max(new_tokens, 64)),
                               "--cache-windows", "none",  # the raw side's whole static cache (see above)
                               "--cache-dir", str(root / "chat-overhead"), "--port", str(common.free_port())],
                              env={})
    backend = Backend(settings)
    return backend, common.run_warm_up(backend)


def launch_app(backend):
    import ui

    demo, (_, url, _) = ui.serve(backend, prevent_thread_lock=True, quiet=True)  # the app's own launch settings
    return demo, url


def make_sides(backend, url: str, new_tokens: int) -> dict:
    import torch
    from gradio_client import Client
    from transformers.generation.streamers import BaseStreamer

    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.devices import synchronize

    engine = backend.engine("chat")
    request = ChatRequest(MESSAGE, greedy=True, max_new_tokens=new_tokens)
    prompt = engine._prepare(engine.validate(request))  # the same padded ids the engine will build
    pad = prompt.bucket - len(prompt.ids)
    ids = torch.tensor([[engine.pad_id] * pad + prompt.ids])  # [1, bucket], left-padded
    mask = torch.tensor([[0] * pad + [1] * len(prompt.ids)])

    class FirstToken(BaseStreamer):
        """Notes when the first new token arrives; the first put() is the prompt."""

        def __init__(self):
            self.prompt_seen, self.first = False, None

        def put(self, value):
            if self.prompt_seen and self.first is None:
                self.first = time.perf_counter()
            self.prompt_seen = True

        def end(self):
            pass

    def generate_raw() -> dict:
        probe = FirstToken()
        cpu, start = time.process_time(), time.perf_counter()
        out = engine.model.generate(input_ids=ids, attention_mask=mask, streamer=probe, pad_token_id=engine.pad_id,
                                    max_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                                    max_cache_len=backend.settings.context_length, disable_compile=True)
        synchronize(engine.placement)
        return _timing(start, probe.first, time.perf_counter(), out.shape[1] - prompt.bucket, new_tokens, cpu)

    # The raw calls run on one long-lived thread of their own, like the engine's generate thread: on this
    # benchmark's main thread (which also runs the HTTP client) the allocator's state moved the raw prefill
    # by up to 15% from one run to the next.
    calls: queue.SimpleQueue = queue.SimpleQueue()
    answers: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [answers.put(call()) for call in iter(calls.get, None)], daemon=True).start()

    def raw() -> dict:
        calls.put(generate_raw)
        return answers.get()

    def through_engine() -> dict:
        first = final = None
        cpu, start = time.process_time(), time.perf_counter()
        for update in engine.stream(request):
            first = first or time.perf_counter()
            final = update
        return _timing(start, first, time.perf_counter(), final.stats.new_tokens, new_tokens, cpu)

    client = Client(url, verbose=False)

    def through_http() -> dict:
        first = done = final = None
        cpu, start = time.process_time(), time.perf_counter()
        job = client.submit(message=MESSAGE, greedy=True, max_new_tokens=new_tokens, api_name="/chat")
        for update in job:
            now = time.perf_counter()
            first = first or now
            if update["done"]:
                done, final = now, update
        if final is None:
            raise RuntimeError(f"the /chat stream ended without a final update: {job.status()}")
        return _timing(start, first, done, final["stats"]["new_tokens"], new_tokens, cpu)

    return {"raw generate": raw, "engine": through_engine, "http /chat": through_http}


def _timing(start: float, first: float | None, done: float, tokens: int, expected: int, cpu_start: float) -> dict:
    if tokens != expected or first is None:
        raise RuntimeError(f"expected {expected} new tokens with a first one, got {tokens} (first={first})")
    return {"ttft_s": first - start, "tok_s": (tokens - 1) / (done - first), "total_s": done - start,
            "cpu_s": time.process_time() - cpu_start}


def run_sides(backend, new_tokens: int, repeats: int) -> dict[str, list[dict]]:
    """Serve the app in this process and run the three sides interleaved."""
    demo, url = launch_app(backend)
    try:
        def progress(name, i, r):
            print(f"  repeat {i + 1} {name}: ttft {r['ttft_s']:.3f} s, {r['tok_s']:.2f} tok/s", file=sys.stderr)

        return common.interleaved(make_sides(backend, url, new_tokens), repeats, warmups=1, settle_s=SETTLE_S,
                                  on_result=progress)
    finally:
        demo.close()


def medians(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    return {name: {k: common.median([r[k] for r in runs]) for k in ("ttft_s", "tok_s", "total_s", "cpu_s")}
            for name, runs in results.items()}


def tiny_breakdown(root: Path, repeats: int) -> str:
    """The same three sides on the tiny demo model (~2 ms of compute per token): the overhead in ms."""
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    from tools.demo_models import plugin as demo_builder

    demo = common.ensure_demo_models(root)
    cache = root / "chat-overhead-tiny"
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "demo-models").exists():
        os.symlink(demo.chat.parent, cache / "demo-models")
    settings = parse_settings(["--models", "tiny", "--no-image", "--device", "cpu", "--cache-dir", str(cache),
                               "--chat-buckets", "64", "--context-length", "256", "--max-new-tokens", str(TINY_TOKENS),
                               "--cache-windows", "none", "--port", str(common.free_port())], env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))  # the builder finds the linked models whole
    backend.runner.run()
    model = backend.engine("chat").model  # the demo model may end its reply: forbid EOS on every side alike
    model.generation_config.suppress_tokens = [*model.generation_config.suppress_tokens,
                                               *backend.engine("chat").eos_ids]
    med = medians(run_sides(backend, TINY_TOKENS, repeats))
    raw = med["raw generate"]
    rows = []
    for name, m in med.items():
        rows.append([name, f"{m['ttft_s'] * 1000:.1f}", f"{1000 / m['tok_s']:.2f}",
                     f"{(1000 / m['tok_s'] - 1000 / raw['tok_s']):+.2f}", f"{m['cpu_s'] * 1000 / TINY_TOKENS:.2f}",
                     f"{(m['cpu_s'] - raw['cpu_s']) * 1000 / TINY_TOKENS:+.2f}"])
    return common.table(["side", "TTFT ms", "ms per token", "added ms per token", "CPU ms per token",
                         "added CPU ms per token"], rows)


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--new-tokens", type=int, default=None, help="new tokens per reply (default 32; quick 8)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 7; quick 2)")
    p.add_argument("--no-tiny", action="store_true", help="skip the per-token breakdown on the tiny model")
    args = p.parse_args()
    new_tokens = args.new_tokens or (8 if args.quick else 32)
    repeats = args.repeats or (2 if args.quick else 7)
    common.set_threads(args.threads)
    backend, warm_s = load_backend(args.root, new_tokens)
    results = run_sides(backend, new_tokens, repeats)
    engine = backend.engine("chat")
    prompt = engine._prepare(engine.validate({"message": MESSAGE}))
    med = medians(results)
    rows = []
    for name, runs in results.items():
        rows.append([name, f"{med[name]['ttft_s']:.3f}", common.spread([r["ttft_s"] for r in runs]),
                     f"{med[name]['tok_s']:.2f}", common.spread([r["tok_s"] for r in runs]),
                     f"{med[name]['total_s']:.2f}", f"{med[name]['cpu_s']:.2f}"])
    raw = med["raw generate"]
    ratios = []
    for name, tps_target in (("engine", 0.95), ("http /chat", 0.90)):
        tps = med[name]["tok_s"] / raw["tok_s"]
        ttft = med[name]["ttft_s"] / raw["ttft_s"]
        ratios.append([f"{name} / raw", f"{tps:.3f}", common.verdict(tps, tps_target, True),
                       f"{ttft:.3f}", common.verdict(ttft, 1.10, False)])
    settings = {
        "model": "Qwen3-0.6B architecture (28 layers, hidden 1024, vocab 151936, tied), random weights, bf16, "
                 f"loaded by ChatEngine.load from {common.FULL_CHAT_DIR}",
        "device / mode": f"{engine.placement.label()} (eager: --compile off)",
        "prompt": f"{len(prompt.ids)} tokens, left-padded to bucket {prompt.bucket} (buckets {BUCKETS}); "
                  f"static cache {CONTEXT} tokens, attended whole on every side (--cache-windows none)",
        "generation": f"greedy, {new_tokens} new tokens every run (checked)",
        "repeats": f"{repeats} timed per side after 1 untimed, interleaved (order rotated and reversed), "
                   f"{SETTLE_S:g} s pause before each; medians",
        "threads": args.threads,
        "malloc arenas": backend.description["allocator"] or "glibc default (up to 8 per core)",
        "warm-up (load + bucket)": f"{warm_s:.1f} s",
        "http client": "gradio_client in this process (its iterator polls every 1 ms); CPU s counts both ends",
    }
    sections = [
        ("Per side (TTFT: call to first token seen by the caller; tok/s: decode after the first token):",
         common.table(["side", "TTFT s (median)", "TTFT range", "tok/s (median)", "tok/s range", "total s",
                       "CPU s (process)"], rows)),
        ("Ratios (same run):", common.table(["ratio", "tok/s ratio", "target", "TTFT ratio", "target"], ratios)),
    ]
    del backend, engine, prompt  # free the full-size model before the tiny one
    if not args.no_tiny:
        sections.append((f"Where the overhead is: the same sides on the tiny demo model ({TINY_TOKENS} tokens, "
                         f"{repeats} repeats, medians), where compute is only a few ms per token:",
                         tiny_breakdown(args.root, repeats)))
    settings["peak RSS of this process"] = f"{common.peak_rss_mb():.0f} MiB"
    common.report("Chat overhead", settings, sections)


if __name__ == "__main__":
    main()
