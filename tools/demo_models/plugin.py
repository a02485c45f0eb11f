"""The demo models as a plug-in: the ``demo_models`` part builds an engine's tiny random-weight model under the
cache root when the settings ask for the demo models (``--models tiny``, or ``--models auto`` falling back). No
flags; ``build.py`` (torch, transformers, diffusers) is imported only when a folder is asked for."""

from __future__ import annotations

from pathlib import Path

from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings


def add_flags(parser) -> None:
    """None: the core's ``--models`` says when the demo models are used."""


def demo_folder(settings: Settings, engine: str) -> Path:
    """The folder of ``engine``'s demo model under the cache root, built first unless complete and whole; only this
    engine's is built, so a failed build spares the other."""
    from .build import ensure_demo_models

    demo = ensure_demo_models(settings.cache_dir, engines=(engine,))
    return demo.chat if engine == "chat" else demo.image


def plug(settings: Settings) -> Parts:
    return Parts(demo_models=demo_folder)
