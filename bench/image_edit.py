"""Image editing cost: an edit with 1 and 2 reference images over text-to-image at the same output size,
and ImageEngine.generate over a raw pipeline call with the same fitted references.

All sides use the one Flux2KleinPipeline the engine loaded (tiny demo model, float32, eager, CPU), at the
largest configured size, the default step count and one seed:

- engine, 0/1/2 references: ``ImageEngine.generate`` with ``ImageRequest.references`` (two synthetic
  photos-as-noise of other sizes, read from PNG bytes, one letterboxed and one cropped), so fitting,
  request checks, the job lock, the progress callback and the PNG write are included;
- raw, 0/1/2 references: ``pipe(image=[fitted references], prompt=..., height, width,
  num_inference_steps, guidance_scale=1.0, generator=<seeded CPU generator>, max_sequence_length=512,
  output_type="pil")`` with the references fitted once beforehand (``fit_reference``), nothing else.

Each engine image must equal the raw one of the same count (checked). The sides are interleaved
(``common.interleaved``: the order rotated and reversed from repeat to repeat), each slot warmed up and
run once untimed first; min and median per side. The transformer's sequence grows with the references
(output tokens x (1 + references), plus the text's 512), so the edit ratios say what a reference costs
on this model; on the CPU stand-in they are not Trainium figures.
Usage: ``python bench/image_edit.py [--quick] [--repeats 5]``.
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PROMPT = "the same scene at night, lit by street lamps"
SEED = 7
COUNTS = (0, 1, 2)
SOURCES = (((300, 200), "letterbox"), ((150, 220), "crop"))  # (width, height) of each reference file, its fit


def reference_files(seed: int = 0) -> list[tuple[bytes, str]]:
    """The references as PNG bytes (random pixels: nothing to compress away) with their fit modes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    files = []
    for (width, height), fit in SOURCES:
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
        files.append((out.getvalue(), fit))
    return files


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 5; quick 2)")
    args = p.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    common.set_threads(args.threads)

    import numpy as np
    import torch

    from neuron_backend.devices import resolve_placements
    from neuron_backend.image.engine import MAX_SEQUENCE_LENGTH, ImageEngine, ImageRequest
    from neuron_backend.image.references import fit_reference, read_reference
    from neuron_backend.settings import parse_settings
    from neuron_backend.shapes import EditSlot, reference_size

    demo = common.ensure_demo_models(args.root)
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(args.root / "image-edit"),
                               "--references", ",".join(str(n) for n in COUNTS)], env={})
    engine = ImageEngine(settings, resolve_placements(settings)["image"], "demo FLUX.2-klein (tiny)")
    engine.load(demo.image)
    size = max(settings.sizes, key=lambda s: s.width * s.height)
    warm_start = time.perf_counter()
    for count in COUNTS:
        engine.warm_up(EditSlot(size, count) if count else size)
    warm_s = time.perf_counter() - warm_start
    pipe, steps = engine._pipe, settings.default_steps
    refs = [read_reference(data, fit, name=f"reference-{i + 1}.png") for i, (data, fit) in
            enumerate(reference_files())]
    fitted = [fit_reference(ref, reference_size(size)).image for ref in refs]
    images: dict[str, object] = {}

    def raw(count: int):
        def run() -> dict:
            edit = {"image": fitted[:count]} if count else {}
            start = time.perf_counter()
            out = pipe(**edit, prompt=PROMPT, height=size.height, width=size.width, num_inference_steps=steps,
                       guidance_scale=1.0, generator=torch.Generator(device="cpu").manual_seed(SEED),
                       max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="pil")
            images[f"raw {count}"] = out.images[0]
            return {"s": time.perf_counter() - start}
        return run

    def through_engine(count: int):
        def run() -> dict:
            start = time.perf_counter()
            result = engine.generate(ImageRequest(PROMPT, size.label, steps=steps, seed=SEED,
                                                  references=tuple(refs[:count])), lambda *_: None)
            images[f"engine {count}"] = result.image
            return {"s": time.perf_counter() - start}
        return run

    sides = {f"{side} {count}": (through_engine if side == "engine" else raw)(count)
             for count in COUNTS for side in ("engine", "raw")}
    results = common.interleaved(sides, repeats, warmups=1)
    for count in COUNTS:
        if not np.array_equal(np.asarray(images[f"engine {count}"]), np.asarray(images[f"raw {count}"])):
            raise SystemExit(f"with {count} references the engine's image differs from the raw call's")
    times = {name: [r["s"] for r in runs] for name, runs in results.items()}
    med = {name: common.median(values) for name, values in times.items()}

    def paired(a: str, b: str) -> float:
        return common.median([x / y for x, y in zip(times[a], times[b], strict=True)])

    tokens = (size.width // 16) * (size.height // 16)
    rows = [[f"{count} reference{'s' if count != 1 else ''}", side, f"{tokens * (1 + count) + MAX_SEQUENCE_LENGTH}",
             f"{min(times[f'{side} {count}']) * 1000:.1f}", f"{med[f'{side} {count}'] * 1000:.1f}"]
            for count in COUNTS for side in ("engine", "raw")]
    low = {name: min(values) for name, values in times.items()}

    def ratios(a: str, b: str) -> list[str]:
        """a over b: of the mins, of the medians, and the median of per-repeat ratios."""
        return [f"{low[a] / low[b]:.3f}", f"{med[a] / med[b]:.3f}", f"{paired(a, b):.3f}"]

    edit_rows = [[f"{count} / 0 references", side, *ratios(f"{side} {count}", f"{side} 0")]
                 for count in COUNTS[1:] for side in ("engine", "raw")]
    engine_rows = [[f"{count} reference{'s' if count != 1 else ''}", *ratios(f"engine {count}", f"raw {count}")]
                   for count in COUNTS]
    settings_rows = {
        "model": "tiny demo FLUX.2-klein (random weights), float32, eager, CPU (a stand-in: not Trainium figures)",
        "request": f"{size.label}, {steps} steps, seed {SEED}, max_sequence_length {MAX_SEQUENCE_LENGTH}",
        "references": "; ".join(f"{w}x{h} PNG, {fit}" for (w, h), fit in SOURCES) + f" -> {reference_size(size).label}",
        "engine extras": "fitting per request, progress callback per step, PNG with parameters saved",
        "raw": "pipe(image=[references fitted once beforehand], ...), output_type pil",
        "warm-up": f"sizes and slots {size.label}, +1ref, +2ref: {warm_s:.1f} s (eager: one step each)",
        "repeats": f"{repeats} timed per side after 1 untimed, 6 sides interleaved (order rotated and reversed)",
        "threads": args.threads,
        "check": "engine image == raw image for each count (pixel-identical)",
    }
    common.report("Image editing", settings_rows, [
        ("Per side (sequence = image tokens x (1 + references) + text):", common.table(
            ["references", "side", "sequence", "min ms", "median ms"], rows)),
        ("Edit over text-to-image, same output size (same run):", common.table(
            ["ratio", "side", "of mins", "of medians", "median of per-repeat ratios"], edit_rows)),
        ("Engine over raw pipeline (same run):", common.table(
            ["references", "of mins", "of medians", "median of per-repeat ratios"], engine_rows)),
    ])


if __name__ == "__main__":
    main()
