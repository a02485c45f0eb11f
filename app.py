"""Gradio app: Qwen3 chat and FLUX.2-klein images on AWS Trainium (or whatever this host has).

The entry point only: settings, the torchrun branch, the ``Backend``, ``ui.serve``. The page lives
in ``ui/``, the engines in ``neuron_backend/``. Run ``python app.py --help`` for every flag.
"""

from __future__ import annotations

import logging
import sys

from neuron_backend import parallel
from neuron_backend.devices import configure_compile_cache, resolve_placements
from neuron_backend.errors import ShowcaseError
from neuron_backend.runtime import Backend, model_folder, run_follower
from neuron_backend.settings import parse_settings

log = logging.getLogger("showcase.app")


def launch(backend: Backend, **kwargs):
    """Start warm-up in the background and serve the UI at once."""
    import ui  # Gradio: imported here so the torchrun followers never load it

    backend.start()
    return ui.serve(backend, **kwargs)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = parse_settings(argv)
        if settings.tp > 1:  # under torchrun: --tp-engine names the sharded engine
            placement = resolve_placements(settings)[settings.tp_engine]
            # Weights first: saving (the demo build) under a process group writes only on rank 0.
            folder = model_folder(settings, settings.tp_engine)
            parallel.init(settings, placement)
            if settings.rank != 0:  # followers serve no UI: they mirror rank 0's generations
                configure_compile_cache(settings.cache_dir)
                run_follower(settings, placement, folder)
                return
        backend = Backend(settings)
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    backend.log_startup()
    try:
        launch(backend)
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
