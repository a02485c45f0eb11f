"""Compile audit: graphs compiled after warm-up, plain library calls vs our engines (inductor on CPU).

One fixed, seeded mix of requests (chat prompts from the bare chat template up to the largest
bucket, random reply lengths, greedy and sampled; images at every configured size with every step
count, random seeds) runs twice, each side in its own fresh process with an empty inductor cache:

- baseline: the calls the Neuron docs show. ``model.generate(..., cache_implementation="static")``
  with no buckets and no fixed cache length, compiled through a ``CompileConfig`` (inductor,
  fullgraph, dynamic=False, ``_compile_all_devices`` so it compiles on CPU); the pipeline's
  transformer compiled with ``pipe.transformer.compile(fullgraph=True, dynamic=False)``. Its warm-up
  is what a careful user of those docs would do: one chat reply of the longest length, and one
  image at each configured size.
- ours: ``Backend`` runs its warm-up plan (load, every bucket, every size), then serves the mix
  through ``Backend.stream_chat`` / ``Backend.generate_image``.

Counted after warm-up: graphs compiled (dynamo unique graphs, the CPU proxy for Neuron compiles),
dynamo recompile-limit hits (with fullgraph=True a hit raises instead of falling back to eager; the
failed requests are counted), and new prompt lengths the eager prefill saw (on Neuron eager mode
compiles every op again for each new length). Usage: ``python bench/compile_audit.py [--quick]``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SIZES = "64x64,96x64,64x96"
BUCKETS = "32,64,128"
CONTEXT = 256
WINDOWS = "128"  # ours: replies cross from cache window 128 into 256 (the tiny preset has none)
MAX_NEW = 64
MAX_STEPS = 4
SEED = 1234


def settings_for(root: Path, quick: bool):
    from neuron_backend.settings import parse_settings

    steps = 2 if quick else MAX_STEPS
    return parse_settings(["--models", "tiny", "--device", "cpu", "--compile", "on", "--cache-dir", str(root),
                           "--sizes", SIZES, "--chat-buckets", BUCKETS, "--context-length", str(CONTEXT),
                           "--cache-windows", WINDOWS, "--max-new-tokens", str(MAX_NEW), "--max-steps", str(steps),
                           "--default-steps", str(steps)],
                          env={})


def make_mix(tokenizer, settings, quick: bool) -> list[dict]:
    """The seeded request mix, identical on both sides."""
    from tools.demo_models.build import DEMO_WORDS

    rng = random.Random(SEED)

    def templated(message: str) -> list[int]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    shortest, largest = len(templated("x")), settings.buckets[-1]
    targets = [shortest, largest] + [rng.randint(shortest, largest) for _ in range(4 if quick else 10)]
    chat = []
    for target in targets:
        message = "x"
        while len(templated(message)) < target:
            message += " " + rng.choice(DEMO_WORDS)  # one token per " word"
        greedy = rng.random() < 0.5
        chat.append({"kind": "chat", "message": message, "ids": templated(message), "greedy": greedy,
                     "max_new_tokens": rng.randint(1, settings.max_new_tokens),
                     "seed": None if greedy else rng.randrange(2**32)})
    images = [{"kind": "image", "prompt": rng.choice(["a fox", "a lighthouse at dusk", "tiny chip"]),
               "size": size.label, "steps": steps, "seed": rng.randrange(2**32)}
              for size in settings.sizes for steps in range(1, settings.max_steps + 1)]
    mix = chat + images
    rng.shuffle(mix)
    return mix


class LimitHits(logging.Handler):
    """Counts dynamo's 'hit config.recompile_limit' warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "hit config." in record.getMessage():
            self.count += 1


def watch_prefill(model, lengths: set[int]) -> None:
    """Record the prompt length of every eager (uncompiled) forward with more than one token."""
    import torch

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not torch.compiler.is_compiling() and ids is not None and ids.shape[-1] > 1:
            lengths.add(int(ids.shape[-1]))

    model.register_forward_pre_hook(hook, with_kwargs=True)


# ----- the two sides, each run in a child process --------------------------------------------------
def run_side(side: str, root: Path, quick: bool) -> dict:
    import torch

    from neuron_backend.devices import CompileCounter

    hits = LimitHits()
    logging.getLogger("torch._dynamo").addHandler(hits)
    logging.getLogger("torch._dynamo.convert_frame").addHandler(hits)
    work = Path(tempfile.mkdtemp(prefix=f"audit-{side}-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")  # empty: every compile is a real one
    demo = common.ensure_demo_models(root)
    (work / "demo-models").symlink_to(demo.chat.parent)  # ours finds the built models under its cache root
    settings = settings_for(work, quick)
    torch._dynamo.reset()
    prefill: set[int] = set()
    start = time.perf_counter()
    serve = (_baseline if side == "baseline" else _ours)(settings, demo, prefill)
    warm_s, warm_graphs = time.perf_counter() - start, CompileCounter.graphs()
    warm_prefill, hits_before = set(prefill), hits.count
    from transformers import AutoTokenizer

    mix = make_mix(AutoTokenizer.from_pretrained(demo.chat), settings, quick)
    failures: dict[str, int] = {}
    per_request = []
    start = time.perf_counter()
    for request in mix:
        before = CompileCounter.graphs()
        try:
            serve(request)
        except Exception as exc:  # noqa: BLE001 - a failed request is a result here, counted and shown
            name = type(exc).__name__
            failures[name] = failures.get(name, 0) + 1
        per_request.append(CompileCounter.graphs() - before)
    return {
        "side": side, "warmup_s": warm_s, "warmup_graphs": warm_graphs, "mix_s": time.perf_counter() - start,
        "requests": len(mix), "chat_requests": sum(r["kind"] == "chat" for r in mix),
        "image_requests": sum(r["kind"] == "image" for r in mix),
        "prompt_lengths": sorted({len(r["ids"]) for r in mix if r["kind"] == "chat"}),
        "graphs_after_warmup": CompileCounter.graphs() - warm_graphs,
        "requests_that_compiled": sum(1 for n in per_request if n),
        "limit_hits": hits.count - hits_before, "failures": failures,
        "new_prefill_lengths": len(prefill - warm_prefill), "warm_prefill_lengths": sorted(warm_prefill),
        "recompile_limit": torch._dynamo.config.recompile_limit, "peak_rss_mb": common.peak_rss_mb(),
    }


def _baseline(settings, demo, prefill: set[int]):
    """Plain library calls as the Neuron docs show them; returns the request function."""
    import torch
    from diffusers import Flux2KleinPipeline
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompileConfig

    tokenizer = AutoTokenizer.from_pretrained(demo.chat)
    model = AutoModelForCausalLM.from_pretrained(demo.chat, dtype=torch.float32).eval()
    watch_prefill(model, prefill)
    compile_config = CompileConfig(backend="inductor", fullgraph=True, dynamic=False, mode="default")
    compile_config._compile_all_devices = True  # what generate() does by itself on neuron/cuda
    pipe = Flux2KleinPipeline.from_pretrained(demo.image, dtype=torch.float32).to("cpu")
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.compile(backend="inductor", fullgraph=True, dynamic=False)

    def chat(ids: list[int], max_new: int, greedy: bool, seed: int | None) -> None:
        sampling = {} if greedy else {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
        if seed is not None:
            torch.manual_seed(seed)
        input_ids = torch.tensor([ids])
        model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new,
                       do_sample=not greedy, cache_implementation="static", compile_config=compile_config,
                       **sampling)

    def image(prompt: str, width: int, height: int, steps: int, seed: int) -> None:
        pipe(prompt=prompt, height=height, width=width, num_inference_steps=steps, guidance_scale=1.0,
             generator=torch.Generator().manual_seed(seed))

    hello = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False,
                                          add_generation_prompt=True, enable_thinking=False)
    chat(tokenizer(hello, add_special_tokens=False)["input_ids"], settings.max_new_tokens, True, None)
    for size in settings.sizes:
        image("a warm-up image", size.width, size.height, 1, 0)

    def serve(r: dict) -> None:
        if r["kind"] == "chat":
            chat(r["ids"], r["max_new_tokens"], r["greedy"], r["seed"])
        else:
            width, height = map(int, r["size"].split("x"))
            image(r["prompt"], width, height, r["steps"], r["seed"])

    return serve


def _ours(settings, demo, prefill: set[int]):
    """Our Backend after its warm-up plan; returns the request function."""
    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.image.engine import ImageRequest
    from neuron_backend.runtime import Backend
    from tools.demo_models import plugin as demo_builder

    class AuditedBackend(Backend):
        def _load(self, task):  # the same load, plus the prefill-length probe on the chat model
            super()._load(task)
            if task.engine == "chat":
                watch_prefill(self.engine("chat").model, prefill)

    backend = AuditedBackend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    failed = [t.name for t in backend.runner.tasks if t.state != "ready"]
    if failed:
        raise RuntimeError(f"warm-up tasks not ready: {failed}")

    def serve(r: dict) -> None:
        if r["kind"] == "chat":
            request = ChatRequest(r["message"], greedy=r["greedy"], max_new_tokens=r["max_new_tokens"], seed=r["seed"])
            for _ in backend.stream_chat(request):
                pass
        else:
            backend.generate_image(ImageRequest(r["prompt"], r["size"], steps=r["steps"], seed=r["seed"]))

    return serve


# ----- the parent: runs both sides, prints the tables ---------------------------------------------
def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--side", choices=["baseline", "ours"], help=argparse_hidden())
    args = p.parse_args()
    if args.side:
        common.set_threads(args.threads)
        logging.basicConfig(level=logging.WARNING)
        print("RESULT " + json.dumps(run_side(args.side, args.root, args.quick)), flush=True)
        return
    common.ensure_demo_models(args.root)
    results = {}
    for side in ("baseline", "ours"):
        argv = [sys.executable, __file__, "--side", side, "--root", str(args.root), "--threads", str(args.threads)]
        with common.Process(argv + (["--quick"] if args.quick else [])) as child:
            child.wait_for(r"^RESULT ", timeout=3600)
            results[side] = json.loads(child.matching(r"^RESULT ")[0].removeprefix("RESULT "))
        print(f"{side}: done", file=sys.stderr)
    base, ours = results["baseline"], results["ours"]
    settings = {
        "sizes": SIZES, "steps": f"1..{2 if args.quick else MAX_STEPS}", "chat buckets (ours)": BUCKETS,
        "context length (ours)": CONTEXT, "reply lengths": f"1..{MAX_NEW} new tokens (random)",
        "prompt lengths": f"{base['prompt_lengths'][0]}..{base['prompt_lengths'][-1]} tokens "
                          f"({len(base['prompt_lengths'])} distinct; {base['prompt_lengths'][0]} = the chat template "
                          "around a 1-character message)",
        "requests": f"{base['requests']} ({base['chat_requests']} chat, {base['image_requests']} image), seed {SEED}",
        "compile": "torch.compile inductor, fullgraph=True, dynamic=False (CPU stand-in for the neuron backend)",
        "models": "tiny demo Qwen3 + FLUX.2-klein (random weights), float32, CPU",
        "threads": args.threads,
        "baseline warm-up": "1 chat reply ('Hello', longest reply length) + 1 image per size (1 step)",
        "ours warm-up": "Backend warm-up plan: load, every bucket (2 tokens), every size (1 step)",
    }
    rows = []
    for name, r in (("plain library calls (baseline)", base), ("our engines", ours)):
        failures = ", ".join(f"{n} x{k}" for n, k in r["failures"].items()) or "0"
        rows.append([name, r["warmup_graphs"], f"{r['warmup_s']:.1f}", r["graphs_after_warmup"],
                     f"{r['requests_that_compiled']}/{r['requests']}", r["limit_hits"], failures,
                     r["new_prefill_lengths"], f"{r['mix_s']:.1f}", f"{r['peak_rss_mb']:.0f}"])
    headers = ["side", "graphs in warm-up", "warm-up s", "graphs after warm-up", "requests that compiled",
               "recompile-limit hits", "failed requests", "new eager prefill lengths", "mix s", "peak RSS MiB"]
    target = "met (0)" if ours["graphs_after_warmup"] == 0 and not ours["failures"] else "MISSED (target 0)"
    summary = (f"Graphs compiled after warm-up: ours {ours['graphs_after_warmup']} — {target}; "
               f"baseline {base['graphs_after_warmup']}, with {base['limit_hits']} recompile-limit hit(s) "
               f"(dynamo limit {base['recompile_limit']}; ours raises it to {ours['recompile_limit']}) and "
               f"{sum(base['failures'].values())} failed request(s); the baseline's eager prefill met "
               f"{base['new_prefill_lengths']} new prompt lengths, ours {ours['new_prefill_lengths']}.")
    common.report("Compile audit", settings, [("Results:", common.table(headers, rows)), ("Verdict:", summary)])


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
