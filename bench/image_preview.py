"""Live preview cost: ImageEngine.generate with preview frames vs without, same request, same run.

One engine (tiny demo FLUX.2-klein, CPU), at the largest configured size (``--size`` to pick another,
e.g. 1024x1024 with ``--sizes``), the default steps unless ``--steps``:

- off: ``generate(request, progress)``, as the app runs with the preview off;
- on: ``generate(request, progress, preview=...)``; the consumer renders every frame it gets
  (latents -> RGB table, scaled up to the image size, as the Image tab does) inside the callback,
  on the engine's own thread: an upper bound, since the app renders on the web thread instead.

The two images must be identical (checked): a preview reads the latents and changes nothing.
Runs are interleaved, the order flipped every repeat. Usage:
``python bench/image_preview.py [--quick] [--repeats 12] [--sizes 1024x1024 --steps 8]``.
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
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 12; quick 3)")
    p.add_argument("--sizes", default=None, help="configured sizes (default: the tiny preset's)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the preset's default)")
    args = p.parse_args()
    repeats = args.repeats or (3 if args.quick else 12)
    common.set_threads(args.threads)

    import numpy as np

    from neuron_backend.devices import resolve_placements
    from neuron_backend.image import engine as engine_module
    from neuron_backend.image.engine import ImageEngine, ImageRequest
    from neuron_backend.settings import parse_settings

    demo = common.ensure_demo_models(args.root)
    flags = ["--models", "tiny", "--device", "cpu", "--cache-dir", str(args.root / "image-preview")]
    settings = parse_settings(flags + (["--sizes", args.sizes] if args.sizes else []), env={})
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "demo FLUX.2-klein (tiny)")
    engine.load(demo.image)
    size = max(settings.sizes, key=lambda s: s.width * s.height)
    engine.warm_up(size)
    steps = args.steps or settings.default_steps
    request = ImageRequest(PROMPT, size.label, steps=steps, seed=SEED)
    images: dict[str, object] = {}
    frames: list[int] = []

    def on_step(step: int, total: int, elapsed: float) -> None:  # what the Image tab's progress computes
        _ = f"step {step}/{total} · ~{elapsed / max(step, 1) * (total - step):.1f} s left"

    def render(frame) -> None:
        frame.image().resize((frame.width, frame.height))
        frames.append(frame.step)

    def off() -> dict:
        cpu, start = time.process_time(), time.perf_counter()
        images["off"] = engine.generate(request, on_step).image
        return {"s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}

    def on() -> dict:
        before, cpu, start = len(frames), time.process_time(), time.perf_counter()
        images["on"] = engine.generate(request, on_step, preview=render).image
        return {"s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu, "frames": len(frames) - before}

    results = common.interleaved({"preview off": off, "preview on": on}, repeats, warmups=1)
    if not np.array_equal(np.asarray(images["off"]), np.asarray(images["on"])):
        raise SystemExit("the image with previews differs from the one without")
    med = {name: common.median([r["s"] for r in runs]) for name, runs in results.items()}
    cpu = {name: common.median([r["cpu_s"] for r in runs]) for name, runs in results.items()}
    rows = [[name, f"{med[name] * 1000:.1f}", common.spread([r["s"] * 1000 for r in runs]), f"{cpu[name] * 1000:.1f}",
             common.spread([r["cpu_s"] * 1000 for r in runs])] for name, runs in results.items()]
    ratio, cpu_ratio = med["preview on"] / med["preview off"], cpu["preview on"] / cpu["preview off"]
    paired = [a["s"] / b["s"] for a, b in zip(results["preview on"], results["preview off"], strict=True)]
    paired_cpu = [a["cpu_s"] / b["cpu_s"] for a, b in zip(results["preview on"], results["preview off"], strict=True)]
    common.report("Live preview cost", {
        "model": "tiny demo FLUX.2-klein (random weights), float32, eager, CPU",
        "request": f"{size.label} (largest configured), {steps} steps, seed {SEED}",
        "preview": f"a frame at most every {engine_module.PREVIEW_INTERVAL_S} s, never for the last step; "
                   f"median {common.median([r['frames'] for r in results['preview on']])} frames per image, "
                   "each rendered on the engine thread (upper bound)",
        "repeats": f"{repeats} timed per side after 1 untimed, interleaved (order reversed every repeat); medians",
        "threads": args.threads,
        "check": "image with previews == image without (pixel-identical)",
    }, [
        ("Per side (CPU time: this process only, steadier than wall time on a shared machine):", common.table(
            ["side", "wall ms (median)", "wall range", "CPU ms (median)", "CPU range"], rows)),
        ("Ratio (same run):", common.table(
            ["ratio", "value", "median of per-pair ratios", "target"],
            [["on / off, wall", f"{ratio:.3f}", f"{common.median(paired):.3f}", common.verdict(ratio, 1.05, False)],
             ["on / off, CPU", f"{cpu_ratio:.3f}", f"{common.median(paired_cpu):.3f}",
              common.verdict(cpu_ratio, 1.05, False)]])),
    ])


if __name__ == "__main__":
    main()
