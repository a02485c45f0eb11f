"""Parity of the device against CPU: greedy tokens of the chat model, one image's PSNR.

The device side is the warmed-up engine of the check's Backend; the reference is a second engine of
the same class loaded from the same folder on CPU, eager, in the device placement's dtype (so a
difference comes from the device, not from the dtype). Tokens go through the engine's own prompt,
bucket, static cache and compile choice (the graphs warm-up built), not a raw ``generate()``, which
on Neuron would compile other graphs.
"""

from __future__ import annotations

import math
import time

PROMPTS = ("Name three colours of the sea.", "What is 17 times 3?", "Write one line about a lighthouse.")
TOKENS = 32  # greedy tokens per prompt; EOS is held off until then (min_new_tokens), so both sides make 32
IMAGE_PROMPT = "a lighthouse at dusk, watercolor"
IMAGE_SEED = 7


def first_divergence(device: list[int], reference: list[int]) -> int | str:
    """The index of the first token that differs, or "none" when both lists are the same.

    Two lists of different lengths that agree as far as the shorter goes diverge at its length."""
    for index, (a, b) in enumerate(zip(device, reference, strict=False)):
        if a != b:
            return index
    return "none" if len(device) == len(reference) else min(len(device), len(reference))


def psnr(device, reference) -> float | str:
    """PSNR in dB of two same-size 8-bit RGB images (PIL), or "inf" when they are identical."""
    import numpy as np

    a = np.asarray(device.convert("RGB"), dtype=np.float64)
    b = np.asarray(reference.convert("RGB"), dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images of different sizes: {a.shape} and {b.shape}")
    mse = float(np.mean((a - b) ** 2))
    return "inf" if mse == 0 else round(10 * math.log10(255.0**2 / mse), 3)


def reference_engine(settings, name: str, folder, model_id: str):
    """The engine ``name`` loaded from ``folder`` on CPU, eager, in ``settings``' resolved dtype."""
    from neuron_backend import devices
    from neuron_backend.runtime import create_engine

    placement = devices.resolve_placements(settings)[name]
    cpu = settings.replace(device="cpu", chat_device=None, image_device=None, compile="off",
                           dtype=placement.dtype_name, compile_repeated_blocks="off")
    engine = create_engine(cpu, name, devices.resolve_placements(cpu)[name], model_id)
    engine.load(folder)
    return engine


def greedy_ids(engine, prompt: str, tokens: int = TOKENS) -> list[int]:
    """``tokens`` greedy token ids of a one-turn chat, through the engine's own generate() arguments.

    Uses the engine's private steps (prompt fitting, the generate() keyword arguments, its job lock):
    its public stream yields text, and the comparison needs ids."""
    from neuron_backend.chat.text import ChatRequest
    from neuron_backend.devices import on_device, synchronize

    request = engine.validate(ChatRequest(prompt, greedy=True, max_new_tokens=tokens))
    fitted = engine._prepare(request)
    with engine.jobs.job(None) as cancelled:
        kwargs = engine._generate_kwargs(request, fitted, cancelled, None, tokens)
        with on_device(engine.placement):
            out = engine.model.generate(**kwargs)  # [1, bucket + tokens], on the inputs' device
        synchronize(engine.placement)
    return out[0, fitted.bucket:].tolist()


def chat_parity(device, reference, prompts=PROMPTS, tokens: int = TOKENS) -> dict:
    """Greedy tokens of each prompt on both engines and where they first differ."""
    rows = []
    for prompt in prompts:
        started = time.perf_counter()
        ours = greedy_ids(device, prompt, tokens)
        middle = time.perf_counter()
        theirs = greedy_ids(reference, prompt, tokens)
        rows.append({"prompt": prompt, "first_divergence": first_divergence(ours, theirs),
                     "device_ids": ours, "reference_ids": theirs,
                     "device_text": device.tokenizer.decode(ours, skip_special_tokens=True),
                     "device_s": round(middle - started, 3), "reference_s": round(time.perf_counter() - middle, 3)})
    return {**_sides(device, reference), "tokens": tokens,
            "prompts": rows, "all_match": all(r["first_divergence"] == "none" for r in rows)}


def _sides(device, reference) -> dict:
    """Which engine ran where: the placements' labels, and the device side's kind and core."""
    return {"device": device.placement.label(), "device_kind": device.placement.kind,
            "device_core": device.placement.core, "reference": reference.placement.label()}


def image_parity(device, reference, size: str, steps: int, seed: int = IMAGE_SEED) -> dict:
    """One image of the same request on both engines and their PSNR."""
    from neuron_backend.image.engine import ImageRequest

    request = ImageRequest(IMAGE_PROMPT, size, steps=steps, seed=seed)
    started = time.perf_counter()
    ours = device.generate(request).image
    middle = time.perf_counter()
    theirs = reference.generate(request).image
    return {**_sides(device, reference), "prompt": IMAGE_PROMPT,
            "size": size, "steps": steps, "seed": seed, "psnr_db": psnr(ours, theirs),
            "device_s": round(middle - started, 3), "reference_s": round(time.perf_counter() - middle, 3)}


def run(backend) -> dict:
    """Chat and image parity of a warmed-up Backend's engines; an engine that is not ready is skipped with why."""
    out: dict = {}
    folders = backend.model_folders()
    for name in ("chat", "image"):
        if name not in backend.placements:
            out[name] = {"skipped": f"the {name} engine is off in these settings"}
            continue
        try:
            engine = backend.engine(name)
        except Exception as exc:  # noqa: BLE001 - the warm-up's failure is the reason
            out[name] = {"skipped": f"the {name} engine is not ready: {type(exc).__name__}: {exc}"}
            continue
        try:
            ref = reference_engine(backend.settings, name, folders[name], backend.model_id(name))
            if name == "chat":
                out[name] = chat_parity(engine, ref)
            else:
                size = backend.settings.sizes[0].label
                out[name] = image_parity(engine, ref, size, engine.default_steps)
        except Exception as exc:  # noqa: BLE001 - a failed comparison is a finding for the report
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        finally:
            ref = None  # the CPU copy goes before the next engine's is loaded
    if all(p.kind == "cpu" for p in backend.placements.values()):
        out["note"] = "no accelerator here: the device side runs on cpu too, so this compares cpu with cpu"
    return out
