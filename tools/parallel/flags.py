"""``--tp`` and ``--tp-engine`` as given, checked: what the plug-in, its protocol and other plug-ins read."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_backend.errors import ConfigError
from neuron_backend.settings import Settings, as_choice, as_int

ENGINES = ("chat", "image")


@dataclass(frozen=True)
class Choice:
    """The flags as given, checked."""

    tp: int  # ranks, one shard each; 1: the engine runs whole
    engine: str  # the engine sharded: "chat" or "image"


def choice(settings: Settings) -> Choice:
    """--tp and --tp-engine, checked: N processes under torchrun, and an engine this app runs."""
    tp = as_int("tp", settings.options.get("tp", 1))
    engine = as_choice("tp-engine", settings.options.get("tp_engine", "chat"), ENGINES)
    if tp < 1:
        raise ConfigError("--tp", f"{tp} is not positive", "1 or more")
    if tp > 1 and settings.world_size != tp:
        raise ConfigError("--tp", f"--tp {tp} needs {tp} processes, this is one of {settings.world_size}",
                          f"launch with: torchrun --nproc_per_node={tp} app.py --tp {tp}")
    if tp > 1 and not getattr(settings, engine):
        other = "image" if engine == "chat" else "chat"
        raise ConfigError("--tp", f"shards the {engine} engine (--tp-engine {engine}), which --no-{engine} "
                          f"disables", f"--tp 1 with --no-{engine}, or --tp-engine {other}")
    return Choice(tp, engine)
