"""Image overhead: ImageEngine.generate (with progress reporting) vs a raw pipeline call, same arguments.

Both sides use the one Flux2KleinPipeline the engine loaded (tiny demo model, CPU), at the largest
configured size and the default step count:

- raw: ``pipe(prompt=..., height, width, num_inference_steps, guidance_scale=1.0, generator=<seeded
  CPU generator>, max_sequence_length=512, output_type="pil")``, nothing else;
- engine: ``ImageEngine.generate`` with a per-step progress callback like the app's (it formats the
  ETA text), so request checks, prompt-token counting, the job lock, the cancel check, the PNG
  with embedded parameters written under the cache root and its pruning are all included.

The two images must be identical (checked). Runs are interleaved, the order flipped every repeat.
Usage: ``python bench/image_overhead.py [--quick] [--repeats 15]``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PROMPT = "a lighthouse at dusk, watercolor"
SEED = 7


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 15; quick 4)")
    args = p.parse_args()
    repeats = args.repeats or (4 if args.quick else 15)
    common.set_threads(args.threads)

    import numpy as np
    import torch

    from neuron_backend.devices import resolve_placements
    from neuron_backend.image.engine import MAX_SEQUENCE_LENGTH, ImageEngine, ImageRequest
    from neuron_backend.settings import parse_settings

    demo = common.ensure_demo_models(args.root)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(args.root / "image-overhead")],
                              env={})
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "demo FLUX.2-klein (tiny)")
    engine.load(demo.image)
    size = max(settings.sizes, key=lambda s: s.width * s.height)
    engine.warm_up(size)
    pipe, steps = engine._pipe, settings.default_steps
    images: dict[str, object] = {}

    def raw() -> dict:
        cpu, start = time.process_time(), time.perf_counter()
        out = pipe(prompt=PROMPT, height=size.height, width=size.width, num_inference_steps=steps,
                   guidance_scale=1.0, generator=torch.Generator(device="cpu").manual_seed(SEED),
                   max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="pil")
        images["raw"] = out.images[0]
        return {"s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}

    progress_calls = []

    def on_step(step: int, total: int, elapsed: float) -> None:  # what app.py's progress callback computes
        eta = elapsed / max(step, 1) * (total - step)
        progress_calls.append(f"step {step}/{total} · ~{eta:.1f} s left")

    save, saves = engine.outputs.save, []

    def timed_save(*a, **k):  # the same save, timed: how much of the engine's time is writing the PNG
        t0 = time.perf_counter()
        try:
            return save(*a, **k)
        finally:
            saves.append(time.perf_counter() - t0)

    engine.outputs.save = timed_save

    def through_engine() -> dict:
        cpu, start = time.process_time(), time.perf_counter()
        result = engine.generate(ImageRequest(PROMPT, size.label, steps=steps, seed=SEED), on_step)
        total = time.perf_counter() - start
        images["engine"] = result.image
        if result.path is None:
            raise RuntimeError(f"the engine did not save the PNG: {result.params.get('save_note')}")
        return {"s": total, "cpu_s": time.process_time() - cpu, "pipe_s": result.seconds, "save_s": saves[-1]}

    results = common.interleaved({"raw pipeline": raw, "engine": through_engine}, repeats, warmups=1)
    if not np.array_equal(np.asarray(images["raw"]), np.asarray(images["engine"])):
        raise SystemExit("the engine's image differs from the raw call's: the arguments are not identical")
    if len(progress_calls) != steps * (repeats + 1):
        raise SystemExit(f"expected {steps} progress calls per engine run, got {len(progress_calls)}")
    med = {name: common.median([r["s"] for r in runs]) for name, runs in results.items()}
    cpu = {name: common.median([r["cpu_s"] for r in runs]) for name, runs in results.items()}
    rows = [[name, f"{med[name] * 1000:.1f}", common.spread([r["s"] * 1000 for r in runs]), f"{cpu[name] * 1000:.1f}"]
            for name, runs in results.items()]
    ratio = med["engine"] / med["raw pipeline"]
    eng = {k: common.median([r[k] for r in results["engine"]]) for k in ("s", "pipe_s", "save_s")}
    split = [[f"{eng['s'] * 1000:.1f}", f"{eng['pipe_s'] * 1000:.1f}", f"{eng['save_s'] * 1000:.1f}",
              f"{(eng['s'] - eng['pipe_s'] - eng['save_s']) * 1000:.1f}",
              f"{common.median([(r['s'] - r['save_s']) for r in results['engine']]) / med['raw pipeline']:.3f}"]]
    paired = [e["s"] / r["s"] for e, r in zip(results["engine"], results["raw pipeline"], strict=True)]
    settings_rows = {
        "model": "tiny demo FLUX.2-klein (random weights), float32, eager, CPU",
        "request": f"{size.label}, {steps} steps, seed {SEED}, prompt {PROMPT!r}, max_sequence_length "
                   f"{MAX_SEQUENCE_LENGTH}",
        "engine extras": "progress callback per step, PNG with parameters saved (outputs/, max 200 kept)",
        "repeats": f"{repeats} timed per side after 1 untimed, interleaved (order reversed every repeat); medians",
        "threads": args.threads,
        "check": "engine image == raw image (pixel-identical)",
    }
    common.report("Image overhead", settings_rows, [
        ("Per side:", common.table(["side", "wall ms (median)", "range ms", "CPU ms (median)"], rows)),
        ("Ratio (same run):", common.table(
            ["ratio", "value", "median of per-pair ratios", "target"],
            [["engine / raw", f"{ratio:.3f}", f"{common.median(paired):.3f}", common.verdict(ratio, 1.05, False)]])),
        ("Where the engine's time goes (medians; the pipeline call includes the progress callbacks):", common.table(
            ["engine ms", "pipeline call ms", "PNG save ms", "other ms", "engine without the PNG save / raw"],
            split)),
    ])


if __name__ == "__main__":
    main()
