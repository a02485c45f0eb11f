"""Tensor parallel under torchrun: one engine sharded over N ranks; rank 0 serves the UI, the others follow.

    torchrun --nproc_per_node=2 app.py --tp 2                     # shards the chat model (default)
    torchrun --nproc_per_node=2 app.py --tp 2 --tp-engine image   # shards the FLUX.2 transformer

Sharding uses transformers' and diffusers' own tensor parallelism, applied by the engines' ``from_pretrained``
with the keywords ``plugin.load_kwargs`` gives. Before each generation of the sharded engine rank 0 broadcasts
the call, and every stop decision, over a gloo side group; the followers run the same call. The protocol, and
what has run where: docs/trainium.md, "Tensor parallel: the lockstep". Imported only with ``--tp`` above 1.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from neuron_backend.devices import Placement
from neuron_backend.errors import ConfigError
from neuron_backend.settings import Settings

from .flags import choice

log = logging.getLogger("showcase.parallel")

# Followers wait in a broadcast between requests, possibly for hours: a short watchdog would kill
# an idle server. torchrun tears the group down when rank 0 exits.
IDLE_TIMEOUT = timedelta(days=7)

_sharded: str | None = None  # the engine this process group shards (set by init)
_control = None  # the gloo side group for control messages (set by init)


def active(engine: str) -> bool:
    """Whether ``engine`` is sharded over several ranks in this process (its collectives must run); the engine
    ``--tp-engine`` does not name runs whole on rank 0 and must not broadcast."""
    return _sharded == engine and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def check_supported(settings: Settings, placement: Placement) -> None:
    """Refuse, before any collective, a sharded engine the library cannot shard on this device."""
    if (given := choice(settings)).tp <= 1 or given.engine != "image":
        return
    # Read at call time: the list is diffusers' own (hooks/tensor_parallel.py), not a copy of ours.
    from diffusers.hooks import tensor_parallel

    supported = tensor_parallel._SUPPORTED_TP_DEVICES
    if placement.kind not in supported:
        raise ConfigError("--tp-engine", f"diffusers' TensorParallelConfig cannot shard the image transformer on "
                          f"{placement.kind} (it supports {', '.join(supported)})",
                          "--tp-engine chat, or --tp-engine image on neuron or cuda")


def init(settings: Settings, placement: Placement) -> None:
    """Join the process group torchrun set up (backend "neuron" on Neuron, gloo on CPU)."""
    global _sharded, _control
    given = choice(settings)
    if given.tp <= 1:
        return
    check_supported(settings, placement)
    if not dist.is_initialized():
        # No set_device first: init_process_group("neuron") binds this rank's core itself (it sets
        # NEURON_RT_VISIBLE_CORES=LOCAL_RANK) and asserts that the runtime is not initialised yet.
        dist.init_process_group(backend=placement.process_group_backend, rank=settings.rank,
                                world_size=settings.world_size, timeout=IDLE_TIMEOUT)
    _control = control_group(placement)
    _sharded = given.engine
    log.info("rank %d of %d joined the %s process group; %s engine sharded", settings.rank,
             settings.world_size, placement.process_group_backend, given.engine)


def control_group(placement: Placement):
    """The group control messages use: a gloo side group beside a device group, else the default group (None).

    Call on every rank in the same order (``new_group`` is collective).
    """
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


def device_mesh(placement: Placement):
    """The 1-D mesh of all ranks on the placement's device kind (diffusers' TensorParallelConfig takes it)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh(placement.kind, list(range(placement.tp)), mesh_dim_names=("tp",))


def stop_flag(cancelled: bool) -> bool:
    """Rank 0's cancel flag, the same on every rank (a broadcast: call it on all ranks in step)."""
    flag = torch.tensor([1 if cancelled else 0], dtype=torch.int32)  # a CPU tensor, on the gloo group
    dist.broadcast(flag, src=0, group=_control)
    return bool(flag.item())


def announce(engine: str, payload) -> None:
    """Rank 0: tell the followers what ``engine`` runs next."""
    dist.broadcast_object_list([(engine, payload)], src=0, group=_control)


def announcer(engine: str) -> Callable[[object], None]:
    """Rank 0: the ``on_generate`` hook of ``engine``: announces each of its generations."""
    return lambda payload: announce(engine, payload)


def shutdown() -> None:
    """Rank 0: release the followers, then close the groups; safe to call when not distributed."""
    if _sharded is not None and active(_sharded) and dist.get_rank() == 0:
        dist.broadcast_object_list([None], src=0, group=_control)
        log.info("followers released")
    close()


def close() -> None:
    """Every rank, last: destroy the process groups. A gloo group left open when the interpreter
    exits aborts the process ("terminate called without an active exception", SIGABRT)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def end_process(code: int = 0) -> NoReturn:
    """Every rank of a tensor-parallel run, last: finish as Python would (non-daemon threads, atexit handlers,
    flushed logs and streams), then ``os._exit`` without the C++ teardown that aborted a rank now and then.
    Call it only where the process is done. Why: docs/trainium.md, "Tensor parallel: the lockstep".
    """
    threading._shutdown()  # what the interpreter's exit does first: join the non-daemon threads
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing left to write to
            pass
    os._exit(code)


def _mirror_chat(engine, payload) -> None:
    request, prompt, min_new_tokens, seed = payload
    for _ in engine._run(dataclasses.replace(request, seed=seed), prompt, min_new_tokens, follower=True):
        pass


def _mirror_image(engine, payload):
    request, seed = payload  # the pipeline call rank 0 announced, stopping where it stops
    with engine.jobs.job() as cancelled:
        return engine._run(engine._loaded_pipe(), request, seed, cancelled, None, None, follower=True)


_MIRRORS = {"chat": _mirror_chat, "image": _mirror_image}


def follow(engine) -> int:
    """Followers: run every generation rank 0 announces until it shuts down; return how many. Ctrl-C is left
    to rank 0, which releases the followers. Main thread only."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engine.agree_stop = stop_flag  # each token (or step) every rank stops at rank 0's
    served = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=_control)
        if box[0] is None:
            return served
        name, payload = box[0]
        if name != engine.name:  # cannot happen unless the ranks were started with different settings
            raise RuntimeError(f"rank 0 announced a {name} generation; this rank holds a {engine.name} shard")
        _MIRRORS[name](engine, payload)
        served += 1


def run_follower(settings: Settings, placement: Placement, folder, parts) -> int:
    """The whole life of a follower rank: load its shard of the ``--tp-engine`` engine, then mirror rank 0's
    generations until it shuts down (``follow``). ``parts``: as rank 0's (its compiled wrappers, its sharding)."""
    from neuron_backend.runtime import asked_model, create_engine
    from neuron_backend.weights import model_ref

    name = parts.sharding.engine
    engine = create_engine(settings, name, placement, model_ref(*asked_model(settings, name)), parts.compiled,
                           sharding=parts.sharding)
    engine.load(folder)
    served = follow(engine)
    close()
    log.info("rank %d served %d %s generations and exits", settings.rank, served, name)
    return served


def join(settings: Settings, parts) -> None:
    """Every rank, before the Backend: join the group; a follower then serves its shard and ends its process here."""
    from neuron_backend.devices import resolve_placements
    from neuron_backend.runtime import model_folder

    name = parts.sharding.engine
    placement = resolve_placements(settings, sharding=parts.sharding)[name]
    # Weights first: saving (the demo build) under a process group writes only on rank 0.
    folder = model_folder(settings, name, parts.demo_models)
    init(settings, placement)
    if settings.rank != 0:  # followers serve no UI: they mirror rank 0's generations
        run_follower(settings, placement, folder, parts)
        end_process()
