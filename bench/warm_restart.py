"""Warm restart: process start to warm-up ready: empty compile cache vs warm cache vs fresh root + bundle.

Each run is a fresh ``python app.py --models tiny --device cpu --compile on`` process; the time is
taken from spawning it to its log line "warm-up finished" (interpreter start, imports, model loads
and every warm-up compile included). Three sides, alternating in each round:
- cold: ``<cache>/compile-cache`` deleted first;
- warm: the same cache root again (what the cold run before it wrote);
- bundle: a brand-new cache root started with ``--cache-bundle`` pointing at the bundle exported
  (``python -m tools.cache export``) from the cold run's cache, as a new host would.
The demo models are built once beforehand and linked into each root (they are not part of the cache).
Usage: ``python bench/warm_restart.py [--quick] [--repeats 3]``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

QUICK_SIZES = "64x64"
SIDES = ("cold", "warm", "bundle")


def one_start(cache: Path, cold: bool, extra: list[str], wait_manifest: bool = False) -> dict:
    if cold:
        shutil.rmtree(cache / "compile-cache", ignore_errors=True)
        (cache / "warmup-history.json").unlink(missing_ok=True)
    port = common.free_port()
    argv = common.app_command("--models", "tiny", "--device", "cpu", "--compile", "on", "--cache-dir", str(cache),
                              "--port", str(port), *extra)
    with common.Process(argv, env={"PYTHONUNBUFFERED": "1"}) as app:
        ready = app.wait_for(r"warm-up finished", timeout=1800)
        if wait_manifest:  # written right after warm-up; the export needs it
            app.wait_for(r"compile-cache manifest written", timeout=300)
        first = app.wait_for(r"warm-up start", timeout=10)
        done = app.matching(r"warm-up done: ")
        failed = app.matching(r"warm-up FAILED")
    if failed:
        raise RuntimeError(f"warm-up failed: {failed}")
    spent: dict[str, float] = {"process start and UI": first}
    for line in done:
        m = re.search(r"warm-up done: [\w ]+ · (.*?) in ([\d.]+) s", line)  # "chat · ...", "compile cache · ..."
        if m:
            what = m.group(1)
            kind = ("bundle install" if "bundle" in what else "weights" if "weights" in what else
                    "load" if what.startswith("load") else "graphs")
            spent[kind] = spent.get(kind, 0.0) + float(m.group(2))
    compiles = [d for d in done if re.search(r" · (prompt bucket|size)", d)]
    return {"ready_s": ready, "compile_tasks": len(compiles), "spent": spent,
            "cache_hits": sum("compile cache hit" in d for d in compiles)}


def link_demo_models(root: Path, demo) -> None:
    root.mkdir(parents=True, exist_ok=True)
    link = root / "demo-models"
    if not link.exists():
        os.symlink(demo.chat.parent, link)  # the app finds the built demo models under its cache root


def export_bundle(cache: Path, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tools.cache", "export", str(out), "--cache-dir", str(cache)],
                   check=True, cwd=common.REPO, capture_output=True)
    return time.perf_counter() - t0


def archive_sha256(path: Path) -> str:
    """What --cache-bundle-sha256 pins: the sha256 of the whole archive."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="cold/warm/bundle rounds (default 3; quick 1)")
    args = p.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    extra = ["--sizes", QUICK_SIZES] if args.quick else []
    demo = common.ensure_demo_models(args.root)
    cache = args.root / "warm-restart"
    link_demo_models(cache, demo)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    exports, sizes_mb = [], []
    for i in range(repeats):
        runs["cold"].append(one_start(cache, True, extra, wait_manifest=True))
        bundle_path = args.root / f"bundle-{i}.tar.gz"
        exports.append(export_bundle(cache, bundle_path))
        sizes_mb.append(bundle_path.stat().st_size / 1e6)
        runs["warm"].append(one_start(cache, False, extra))
        fresh = args.root / f"warm-restart-fresh-{i}"
        shutil.rmtree(fresh, ignore_errors=True)
        link_demo_models(fresh, demo)
        runs["bundle"].append(one_start(fresh, False, [*extra, "--cache-bundle", str(bundle_path),
                                                       "--cache-bundle-sha256", archive_sha256(bundle_path)]))
        for side in SIDES:
            r = runs[side][-1]
            print(f"  round {i + 1} {side}: ready after {r['ready_s']:.1f} s, cache hits {r['cache_hits']}/"
                  f"{r['compile_tasks']}", file=sys.stderr)
    med = {side: common.median([r["ready_s"] for r in rs]) for side, rs in runs.items()}
    rows = [[side, f"{med[side]:.1f}", common.spread([r["ready_s"] for r in rs]),
             ", ".join(f"{r['cache_hits']}/{r['compile_tasks']}" for r in rs)] for side, rs in runs.items()]
    ratios = []
    for side, target in (("warm", 0.3), ("bundle", 0.3)):
        pairs = [s["ready_s"] / c["ready_s"] for c, s in zip(runs["cold"], runs[side], strict=True)]
        ratio = med[side] / med["cold"]
        ratios.append([f"{side} / cold", f"{ratio:.3f}", f"{common.median(pairs):.3f}",
                       common.verdict(ratio, target, False) + (" (stretch 0.15: " +
                                                                common.verdict(ratio, 0.15, False) + ")")])
    kinds = sorted({k for rs in runs.values() for r in rs for k in r["spent"]})
    spent_rows = [[side] + [f"{common.median([r['spent'].get(k, 0.0) for r in rs]):.1f}" for k in kinds]
                  for side, rs in runs.items()]
    from neuron_backend.settings import TINY_PRESET

    sizes = QUICK_SIZES if args.quick else ",".join(s.label for s in TINY_PRESET.sizes)
    settings = {
        "command": f"python app.py --models tiny --device cpu --compile on --cache-dir <cache>"
                   f"{' --sizes ' + QUICK_SIZES if args.quick else ''}"
                   " [--cache-bundle <bundle> --cache-bundle-sha256 <its sha256>]",
        "shapes warmed": f"chat buckets {','.join(map(str, TINY_PRESET.buckets))}, sizes {sizes}",
        "compile": "inductor on CPU (stand-in for neuron); inductor cache under <cache>/compile-cache/inductor",
        "not cleared": "inductor's precompiled C++ headers (/tmp/torchinductor_<user>), the OS file cache",
        "bundle": f"exported after each cold run in {common.median(exports):.1f} s, "
                  f"{common.median(sizes_mb):.1f} MB (gzip)",
        "repeats": f"{repeats} rounds of cold, warm, bundle; medians",
    }
    common.report("Warm restart", settings, [
        ("Start to warm-up ready:", common.table(
            ["cache", "seconds (median)", "range", "shape tasks with a compile cache hit, per run"], rows)),
        ("Ratios (same run):", common.table(["ratio", "value", "median of per-round ratios", "target"], ratios)),
        ("Where the time goes (median seconds; 'process start and UI' is spawn to the first warm-up task):",
         common.table(["side", *kinds], spent_rows)),
    ])


if __name__ == "__main__":
    main()
