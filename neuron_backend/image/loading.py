"""Before and around ``Flux2KleinPipeline.from_pretrained``: check the files, the memory, the defaults.

Every component folder is verified (all problems named at once), the memory plan picks the dtype and VAE
decode, ``force_upcast`` is kept, a non-distilled checkpoint gets 50 default steps. Why each: docs/weights.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
from pathlib import Path

import torch

from ..errors import EngineUnavailableError, IncompatibleModelError
from ..memory import MemoryPlan, NotEnoughMemory, free_bytes, plan_image, vae_upcast
from ..messages import tr
from ..weights import BrokenModelFile, read_json_file, verify_folder

NON_DISTILLED_STEPS = 50  # Flux2KleinPipeline.__call__'s num_inference_steps default, documented for the base model


def check_files(folder: Path, model_id: str) -> None:
    """Raise EngineUnavailableError naming every broken or missing file of the pipeline folder."""
    problems = verify_folder(folder, "image")
    if problems:
        raise EngineUnavailableError(
            f"The image model {model_id} in {folder} is incomplete or damaged: " + "; ".join(problems)
            + ". Download those files again (hf download <repo> --local-dir <folder>) or point --image-model "
            "at a complete folder.")


def prepare(folder: Path, model_id: str, placement, settings) -> tuple[object, MemoryPlan]:
    """Check the files and the memory: (the placement to load with, the memory plan: decode dtype, panel line)."""
    check_files(folder, model_id)
    plan = plan_memory(folder, placement, settings)
    if plan.dtype != placement.dtype:  # --dtype auto and float32 does not fit: bfloat16 does
        placement = dataclasses.replace(placement, dtype=plan.dtype)
    return placement, plan


def plan_memory(folder: Path, placement, settings) -> MemoryPlan:
    """The dtype to load with, the decode's, and the panel's memory line; EngineUnavailableError when it cannot fit."""
    core = int(placement.device.partition(":")[2] or 0) if placement.kind != "cpu" else None
    try:
        return plan_image(folder, placement.dtype, settings.dtype, settings.sizes, placement.kind,
                          free_bytes(placement.kind, core, placement.runtime_core), max(settings.references),
                          placement.tp)
    except NotEnoughMemory as exc:
        raise EngineUnavailableError(exc.args[0]) from None  # a Message: shown in the page's language


def check_text_layers(pipe, model_id: str) -> None:
    """Refuse a text encoder with fewer layers than the pipeline reads (``text_encoder_out_layers``).

    The pipeline stacks ``hidden_states[k]`` for each k of its ``text_encoder_out_layers`` default;
    a model of L layers has L + 1 hidden states (the embeddings first), so each k must be in -(L+1)..L.
    """
    parameter = inspect.signature(type(pipe).__call__).parameters.get("text_encoder_out_layers")
    config = getattr(getattr(pipe, "text_encoder", None), "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    if parameter is None or not isinstance(layers, int) or not parameter.default:
        return
    wanted = tuple(parameter.default)
    if all(-(layers + 1) <= k <= layers for k in wanted):
        return
    needed = max(k if k >= 0 else -k - 1 for k in wanted)
    raise IncompatibleModelError(tr(
        "The image model {model} cannot run: its text encoder has {layers} layers, but {pipeline} reads the "
        "hidden states of layers {wanted} (text_encoder_out_layers), so it needs at least {needed}. Point "
        "--image-model at a FLUX.2-klein folder whose text_encoder/ is the one it was trained with.",
        model=model_id, layers=layers, pipeline=type(pipe).__name__, wanted=", ".join(map(str, wanted)),
        needed=needed))


def cause_chain(exc: BaseException) -> str:
    """'A: x <- caused by B: y': every distinct message of an exception and its causes/contexts."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = f"{type(exc).__name__}: {exc}".strip()
        if text not in parts:
            parts.append(text)
        exc = exc.__cause__ or exc.__context__
    return " <- caused by ".join(parts)


class _DropUpcastWarning(logging.Filter):
    """Drops diffusers' 'config attributes {'force_upcast': ...} ... will be ignored' (kept below instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("force_upcast" in message and "ignored" in message)


@contextlib.contextmanager
def quiet_upcast_warning():
    """While loading: no warning for the force_upcast value that keep_force_upcast restores."""
    logger = logging.getLogger("diffusers.configuration_utils")
    quiet = _DropUpcastWarning()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def keep_force_upcast(pipe, folder: Path, upcast: bool = True) -> bool:
    """Restore the VAE config's force_upcast and, on a 16-bit load, decode in float32 unless ``upcast`` is
    False (the memory plan found no room for it); return whether the decode runs in float32."""
    if not vae_upcast(folder):
        return False
    vae = pipe.vae
    vae.register_to_config(force_upcast=True)
    if not upcast:
        return vae.dtype == torch.float32
    if vae.dtype != torch.float32:
        vae.to(torch.float32)
        first = vae.post_quant_conv if vae.post_quant_conv is not None else vae.decoder

        def to_float32(module, args):  # the pipeline hands the decoder latents in the transformer's dtype
            return tuple(a.to(torch.float32) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

        first.register_forward_pre_hook(to_float32)
    return True


def is_distilled(pipe) -> bool:
    """Whether a loaded pipeline is step-distilled: its config's ``is_distilled``, False when absent (as
    Flux2KleinPipeline reads it)."""
    return bool(pipe.config.get("is_distilled", False))


def distilled_on_disk(model_index: Path | None) -> bool | None:
    """``is_distilled`` as the pipeline will read it from this model_index.json, before it loads (absent: False,
    as ``is_distilled``); None where the file is not there or not readable (not fetched yet)."""
    if model_index is None:
        return None
    try:
        index = read_json_file(model_index.parent, model_index.name)
    except BrokenModelFile:
        return None
    return bool(index.get("is_distilled", False))


def default_steps(distilled: bool, settings) -> int:
    """Steps when a request names none: --default-steps if given, else 4 (distilled) or 50 (base)."""
    if getattr(settings, "default_steps_set", False):
        return settings.default_steps
    steps = settings.default_steps if distilled else NON_DISTILLED_STEPS
    return min(steps, settings.max_steps)
