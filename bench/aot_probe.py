"""Can a warm start skip dynamo's tracing? One chat decode graph, AOT-compiled and loaded, against a warm
``torch.compile`` (inductor's cache hit, dynamo traces again).

The demo chat model with the compiled forward's attention (``static_cache.use_compiled_attention``), a static
cache, one decode step ``[1, 1]`` over it. One process compiles the step with ``torch.compile(step,
fullgraph=True).aot_compile(...)`` and saves it (``save_compiled_function``); then, in fresh processes, sides
interleaved: **aot** loads it (``torch.compiler.load_compiled_function``) and calls it once, **warm** calls
``torch.compile(step, fullgraph=True)`` once on the same inductor cache. Each side prints its seconds to the first
logits and the logits' checksum; both must equal the eager step's, bit for bit.

What the AOT path needs, found here: ``fullgraph=True`` (a graph break is refused); no guards kept
(``guard_filter_fn`` dropping them all: dynamo cannot serialise the model's ID_MATCH guards), so the caller
dispatches per shape itself, as the engine's declared shapes allow; and on loading, the module objects the saved
code refers to (``f_globals``, e.g. ``collections``), which the loader names when they are missing.

    python bench/aot_probe.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import interleaved, median, parser, report, spread, table

SAVED = "decode.aot"


def step(model, cache, input_ids, cache_position):
    return model(input_ids=input_ids, past_key_values=cache, cache_position=cache_position, use_cache=True).logits


def _setup(root: Path, batches: tuple[int, ...]):
    """The demo chat model as the compiled engine sets it up and, per batch size, a static cache holding a 4-token
    prompt and the step's arguments."""
    import torch
    from transformers import AutoModelForCausalLM, StaticCache

    from neuron_backend.chat import static_cache
    from tools.demo_models.build import ensure_demo_models

    model = AutoModelForCausalLM.from_pretrained(ensure_demo_models(root, ("chat",)).chat,
                                                 dtype=torch.float32).eval()
    static_cache.use_compiled_attention(model, static_masks=False)
    steps = {}
    for batch in batches:
        cache = StaticCache(config=model.config, max_cache_len=256)
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 6, 7, 8]] * batch), past_key_values=cache,
                  cache_position=torch.arange(4), use_cache=True)
        steps[batch] = (model, cache, torch.tensor([[9]] * batch), torch.tensor([4]))
    return steps


def _checksum(logits) -> str:
    import hashlib

    return hashlib.sha256(logits.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


def _load(path: Path):
    """The saved step, with the module objects its code refers to (the aliases saved beside it)."""
    import torch

    aliases = json.loads(path.with_suffix(".modules.json").read_text())
    scope = {**globals(), **{alias: importlib.import_module(name) for alias, name in aliases.items()}}
    with open(path, "rb") as file:
        return torch.compiler.load_compiled_function(file, f_globals=scope)


def child(side: str, root: Path, batches: tuple[int, ...]) -> dict:
    """One decode graph per batch size: compiled and saved, loaded, traced warm, or run eager."""
    import torch

    from tools.aot import forward as aot  # what the engine saves beside each forward, found the same way

    steps, seconds, sums = _setup(root, batches), {}, {}
    warm = torch.compile(step, fullgraph=True, dynamic=False)
    started = time.perf_counter()
    with torch.no_grad():
        for batch, args in steps.items():
            begun = time.perf_counter()
            if side == "save":
                keep_none = {"guard_filter_fn": lambda entries: [False for _ in entries]}
                fn = torch.compile(step, fullgraph=True, dynamic=False, options=keep_none).aot_compile((args, {}))
                logits = fn(*args)
                fn.save_compiled_function(str(root / f"decode-{batch}.aot"))
                (root / f"decode-{batch}.modules.json").write_text(json.dumps(aot._module_aliases(fn)))
            elif side == "aot":
                logits = _load(root / f"decode-{batch}.aot")(*args)
            elif side == "warm":
                logits = warm(*args)
            else:  # eager
                logits = step(*args)
            seconds[batch], sums[batch] = time.perf_counter() - begun, _checksum(logits[:, -1])
    return {"seconds": time.perf_counter() - started, "per_graph": seconds, "checksums": sums}


def run(side: str, root: Path, batches: tuple[int, ...]) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", side, "--root", str(root), "--batches",
                           ",".join(map(str, batches))], capture_output=True,
                          text=True, timeout=900, check=True,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
                               "HF_HUB_OFFLINE": "1"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", default="1,2,4", help="one decode graph per batch size (default 1,2,4)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    batches = tuple(int(b) for b in args.batches.split(","))
    if args.child:
        print(json.dumps(child(args.child, Path(args.root), batches)))
        return
    args.root.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="aot-probe-", dir=args.root))  # a cold inductor cache for the save side
    saved = run("save", root, batches)
    results = interleaved({"aot": lambda: run("aot", root, batches), "warm": lambda: run("warm", root, batches)},
                          args.repeats, warmups=0)
    rows = []
    for side, runs in results.items():
        per_graph = [median([r["per_graph"][str(b)] for r in runs]) for b in batches]
        same = all(r["checksums"] == saved["checksums"] for r in runs)
        rows.append([side, f"{median([r['seconds'] for r in runs]):.2f}", spread([r["seconds"] for r in runs]),
                     " / ".join(f"{s:.2f}" for s in per_graph), same])
    ratio = median([a["seconds"] / w["seconds"] for a, w in zip(results["aot"], results["warm"], strict=True)])
    report("AOT-loaded decode graphs vs warm torch.compile", {
        "repeats": args.repeats, "graphs": f"decode [B, 1] for B in {args.batches}, static cache of 256",
        "first compile of all (save side) s": f"{saved['seconds']:.2f}"},
           [("Seconds to the first logits of every graph in a fresh process (after model load)",
             table(["side", "median s", "spread", "per graph, median s", "same logits as the save side"], rows)),
            ("aot / warm (median of per-repeat ratios)", f"{ratio:.3f}")])


if __name__ == "__main__":
    main()
