"""Tensor parallel as a plug-in: ``--tp N`` shards the engine ``--tp-engine`` names (chat|image) over the N ranks
torchrun starts. Above 1 its ``sharding`` part tells the core the shard count, the keywords that load a shard
(transformers' and diffusers' own tensor parallelism, applied after load as gpt-fast's tp.py does) and the
group's life cycle (``protocol.py``); at 1 it adds nothing and no process imports ``protocol.py``."""

from __future__ import annotations

from neuron_backend.plugins import Parts, Sharding
from neuron_backend.settings import Settings, add_flag

from .flags import Choice, choice

__all__ = ["Choice", "add_flags", "choice", "plug", "shards"]


def add_flags(parser) -> None:
    group = parser.add_argument_group("tensor parallel (tools/parallel)")
    add_flag(group, "tp", "int", "shard one engine over N cores (tensor parallel); launch with torchrun "
                                 "--nproc_per_node=N")
    add_flag(group, "tp-engine", "str", "chat|image: the engine --tp shards (default chat; image: the FLUX.2 "
                                        "transformer)")


def shards(settings: Settings, engine: str) -> bool:
    """Whether --tp shards ``engine`` (over more than one rank)."""
    given = choice(settings)
    return given.tp > 1 and given.engine == engine


def load_kwargs(engine: str, placement) -> dict:
    """``Sharding.load_kwargs``: the ``from_pretrained`` keywords of this rank's shard (chat: the model; image: the
    transformer, the rest of the pipeline whole)."""
    if engine == "chat":
        from transformers import DistributedConfig

        return {"distributed_config": DistributedConfig(tp_size=placement.tp)}
    import diffusers

    from .protocol import device_mesh

    return {"parallel_config": diffusers.TensorParallelConfig(mesh=device_mesh(placement))}


def attach(name: str, engine) -> None:
    """``Sharding.attach``, rank 0: announce each of ``engine``'s generations; stop where rank 0 stops."""
    from .protocol import announcer, stop_flag

    engine.on_generate, engine.agree_stop = announcer(name), stop_flag


def join(settings: Settings, parts: Parts) -> None:
    """``Sharding.join``: every rank joins the group; a follower serves its shard and ends its process there."""
    from . import protocol

    protocol.join(settings, parts)


def release() -> None:
    """``Sharding.release``, rank 0 after serving: release the followers, close the groups."""
    from . import protocol

    protocol.shutdown()


def end() -> None:
    """``Sharding.end``, rank 0 last: end the process as ``protocol.end_process`` does."""
    from . import protocol

    protocol.end_process()


def plug(settings: Settings) -> Parts:
    given = choice(settings)
    if given.tp == 1:
        return Parts()
    return Parts(sharding=Sharding(engine=given.engine, count=given.tp, load_kwargs=load_kwargs, attach=attach,
                                   join=join, release=release, end=end))
