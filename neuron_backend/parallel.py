"""Tensor-parallel chat under torchrun: rank 0 serves the UI, the other ranks follow each request.

    torchrun --nproc_per_node=2 app.py --tp 2

Every rank loads its shard of the chat model through transformers'
``from_pretrained(..., distributed_config=DistributedConfig(tp_size=N))``. Generation runs in
lockstep: right before each ``generate()`` (warm-up included) rank 0 broadcasts the prompt, the
request and the seed it drew; each follower runs the same call and discards the text. The
cancel check after every token is itself a broadcast from rank 0 (see ``chat._CancelCriteria``),
so a stop ends every rank at the same token. When rank 0 shuts down it broadcasts ``None`` and
the followers return.

Only the chat engine is sharded. The image engine stays whole on rank 0: diffusers'
``TensorParallelConfig`` needs the "neuron" process group and does not run on CPU/gloo
(NOTES.md section 3), so it is not wired up here.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from .devices import Placement
from .settings import Settings

log = logging.getLogger("showcase.parallel")

# Followers wait in a broadcast between requests, possibly for hours: a short watchdog would kill
# an idle server. torchrun tears the group down when rank 0 exits.
IDLE_TIMEOUT = timedelta(days=7)


def active() -> bool:
    """Whether this process is one of several ranks."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init(settings: Settings, placement: Placement) -> None:
    """Join the process group torchrun set up (backend "neuron" on Neuron, gloo on CPU)."""
    if settings.tp <= 1 or dist.is_initialized():
        return
    if placement.kind == "neuron":
        torch.neuron.set_device(settings.local_rank)  # bind this rank's core before the group
    dist.init_process_group(backend=placement.process_group_backend, rank=settings.rank,
                            world_size=settings.world_size, timeout=IDLE_TIMEOUT)
    log.info("rank %d of %d joined the %s process group", settings.rank, settings.world_size,
             placement.process_group_backend)


def stop_flag(cancelled: bool) -> bool:
    """Rank 0's cancel flag, the same on every rank (a broadcast: call it on all ranks in step)."""
    flag = torch.tensor([1 if cancelled else 0], dtype=torch.int32)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def announce(command) -> None:
    """Rank 0: tell the followers what to run next (``None``: shut down)."""
    dist.broadcast_object_list([command], src=0)


def shutdown() -> None:
    """Rank 0: release the followers; safe to call when not distributed."""
    if active() and dist.get_rank() == 0:
        announce(None)
        log.info("followers released")


def follow(engine) -> int:
    """Followers: run every generation rank 0 announces until it shuts down; return how many."""
    served = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        command = box[0]
        if command is None:
            return served
        request, prompt, min_new_tokens, seed = command
        for _ in engine._run(dataclasses.replace(request, seed=seed), prompt, min_new_tokens, follower=True):
            pass
        served += 1


def run_follower(settings: Settings, placement: Placement, folder) -> int:
    """The whole life of a follower rank: load its shard, then follow rank 0."""
    from .chat import ChatEngine

    engine = ChatEngine(settings, placement, settings.chat_model)
    engine.load(folder)
    served = follow(engine)
    log.info("rank %d served %d generations and exits", settings.rank, served)
    return served
