"""Warm restart: process start to warm-up ready, empty compile cache vs a warm one (compile on, CPU).

Each run is a fresh ``python app.py --models tiny --device cpu --compile on`` process; the time is
taken from spawning it to its log line "warm-up finished" (interpreter start, imports, model loads
and every warm-up compile included). Cold runs start with ``<cache>/compile-cache`` deleted; each
warm run reuses the cache the cold run before it wrote. Runs alternate cold, warm, cold, warm...
The demo models are built once beforehand (they are not part of the compile cache).
Usage: ``python bench/warm_restart.py [--quick] [--repeats 3]``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

QUICK_SIZES = "64x64"


def one_start(cache: Path, cold: bool, extra: list[str]) -> dict:
    if cold:
        shutil.rmtree(cache / "compile-cache", ignore_errors=True)
        (cache / "warmup-history.json").unlink(missing_ok=True)
    port = common.free_port()
    argv = common.app_command("--models", "tiny", "--device", "cpu", "--compile", "on", "--cache-dir", str(cache),
                              "--port", str(port), *extra)
    with common.Process(argv, env={"PYTHONUNBUFFERED": "1"}) as app:
        ready = app.wait_for(r"warm-up finished", timeout=1800)
        done = app.matching(r"warm-up done: .* · (prompt bucket|size)")
        failed = app.matching(r"warm-up FAILED")
    if failed:
        raise RuntimeError(f"warm-up failed: {failed}")
    return {"ready_s": ready, "compile_tasks": len(done), "cache_hits": sum("compile cache hit" in d for d in done)}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="cold+warm pairs (default 3; quick 1)")
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    extra = ["--sizes", QUICK_SIZES] if args.quick else []
    demo = common.ensure_demo_models(args.root)
    cache = args.root / "warm-restart"
    cache.mkdir(parents=True, exist_ok=True)
    link = cache / "demo-models"
    if not link.exists():
        os.symlink(demo.chat.parent, link)  # the app finds the built demo models under its cache root
    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    for i in range(repeats):
        for kind in ("cold", "warm"):
            runs[kind].append(one_start(cache, kind == "cold", extra))
            r = runs[kind][-1]
            print(f"  pair {i + 1} {kind}: ready after {r['ready_s']:.1f} s, cache hits {r['cache_hits']}/"
                  f"{r['compile_tasks']}", file=sys.stderr)
    med = {kind: common.median([r["ready_s"] for r in rs]) for kind, rs in runs.items()}
    rows = [[kind, f"{med[kind]:.1f}", common.spread([r["ready_s"] for r in rs]),
             ", ".join(f"{r['cache_hits']}/{r['compile_tasks']}" for r in rs)] for kind, rs in runs.items()]
    ratio = med["warm"] / med["cold"]
    pairs = [w["ready_s"] / c["ready_s"] for c, w in zip(runs["cold"], runs["warm"], strict=True)]
    from neuron_backend.settings import TINY_PRESET

    sizes = QUICK_SIZES if args.quick else ",".join(s.label for s in TINY_PRESET.sizes)
    settings = {
        "command": f"python app.py --models tiny --device cpu --compile on --cache-dir <cache>"
                   f"{' --sizes ' + QUICK_SIZES if args.quick else ''}",
        "shapes warmed": f"chat buckets {','.join(map(str, TINY_PRESET.buckets))} (1 decode graph), sizes {sizes}",
        "compile": "inductor on CPU (stand-in for neuron); inductor cache under <cache>/compile-cache/inductor",
        "not cleared": "inductor's precompiled C++ headers (/tmp/torchinductor_<user>), the OS file cache",
        "torch threads": "the app's default",
        "repeats": f"{repeats} cold/warm pairs, alternating; medians",
    }
    common.report("Warm restart", settings, [
        ("Start to warm-up ready:", common.table(
            ["cache", "seconds (median)", "range", "shape tasks with a compile cache hit, per run"], rows)),
        ("Ratio (same run):", common.table(["ratio", "value", "median of per-pair ratios", "target"],
                                           [["warm / cold", f"{ratio:.3f}", f"{common.median(pairs):.3f}",
                                             common.verdict(ratio, 0.3, False)]])),
    ])


if __name__ == "__main__":
    main()
