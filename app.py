"""Gradio app: Qwen3 chat and FLUX.2-klein images on AWS Trainium (or whatever this host has).

The entry point only: settings, the compile-cache folders, the torchrun branch, the ``Backend``,
``ui.serve``. The page lives in ``ui/``, the engines in ``neuron_backend/``. Run ``python app.py
--help`` for every flag, ``python app.py --doctor`` for a first-run checklist of this host.

Order matters on Trainium (docs/trainium.md): the settings, this interpreter's folder first on ``PATH``
(TorchNeuron runs the ``neuronx-cc`` it finds there) and the NEFF cache variables come first, without
torch; ``import torch`` then autoloads torch-neuronx, which reads them, and a broken Neuron install fails
right there, so that import is guarded with a message saying what to do.
"""

from __future__ import annotations

import logging
import sys
from importlib import metadata

from neuron_backend.compile_cache import configure_compile_cache  # imports no torch
from neuron_backend.errors import ShowcaseError
from neuron_backend.neuron_install import interpreter_bin_first, load_failure  # imports no torch
from neuron_backend.settings import parse_settings

log = logging.getLogger("showcase.app")

LOAD_FAILURE = """\
error: PyTorch could not load its Neuron backend (torch-neuronx): {cause}
  installed: torch {torch}, torch-neuronx {neuronx}
  {fix}.
  Then check the host with `python app.py --doctor`.
  To run on CPU meanwhile: TORCH_DEVICE_BACKEND_AUTOLOAD=0 python app.py --device cpu"""


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def backend_load_failure(exc: BaseException) -> str | None:
    """The message for a torch-neuronx that ``import torch`` could not load, or None for other errors.

    The fix follows the cause (``neuron_install.load_failure``): the Neuron runtime missing, a glibc older
    than the wheels', or torch and torch-neuronx of different families.
    """
    failure = load_failure(exc)
    if failure is None:
        return None
    return LOAD_FAILURE.format(cause=failure.cause, torch=_version("torch"), neuronx=_version("torch-neuronx"),
                               fix=failure.fix)


def _import_runtime():
    """The torch-importing modules, imported only after the cache folders are set."""
    from neuron_backend import parallel
    from neuron_backend.devices import resolve_placements
    from neuron_backend.runtime import Backend, model_folder, run_follower

    return parallel, resolve_placements, Backend, model_folder, run_follower


def annex_tabs() -> list:
    """The tabs of the annex (``tools/``), handed to the page as plain values: the QA bench."""
    from tools.qa.tab import TAB as QA_TAB

    return [QA_TAB]


def annex_chat_extras() -> list:
    """What the annex adds under the chatbot: the 👍/👎 feedback row (marks the QA bench reads)."""
    from tools.qa.feedback_row import wire_feedback

    return [wire_feedback]


def annex_details() -> list:
    """What the annex adds to the warm-up details: the operator's compile-cache Export."""
    from tools.cache.panel import build_export

    return [build_export]


def annex_hooks() -> list:
    """The annex's warm-up hooks, handed to Backend: compile-cache bundles (install, record)."""
    from tools.cache.warm_start import WarmStart

    return [WarmStart]


def annex_remote():
    """The annex's remote engines, handed to Backend: what --chat-server and --image-server connect to."""
    from tools.remote import RemoteEngines

    return RemoteEngines


def annex_routes(backend) -> list:
    """The annex's HTTP routes, served beside the probes: the OpenAI-compatible /v1 API."""
    from tools.openai_api.routes import openai_routes

    return openai_routes(backend)


def annex_middleware() -> list:
    """The annex's outermost middleware: /v1's error answers in OpenAI's shape, whoever made them."""
    from starlette.middleware import Middleware

    from tools.openai_api.errors import OpenAIErrors

    return [Middleware(OpenAIErrors)]


def annex_page_hooks(settings) -> list:
    """The annex's page hooks: under ``--mcp``, the chat, image and status endpoints as MCP tools."""
    from tools.mcp import attach

    return [attach] if settings.mcp else []


def annex_parts(backend) -> dict:
    """Everything the annex adds to the page, as ``ui.serve``'s keyword arguments."""
    return {"tabs": annex_tabs(), "details": annex_details(), "routes": annex_routes(backend),
            "chat_extras": annex_chat_extras(), "page_hooks": annex_page_hooks(backend.settings),
            "middleware": annex_middleware()}


def launch(backend, **kwargs):
    """Serve the UI, then start warm-up in the background, then block (unless ``prevent_thread_lock``).

    In this order because ``launch()`` checks once that the server answers (a ``HEAD /`` with a 3 s
    timeout) and fails the start when it does not: a warm-up thread already loading gigabytes of weights
    can starve that check on a busy host."""
    import ui  # Gradio: imported here so the torchrun followers never load it

    demo, launched = ui.serve(backend, **annex_parts(backend), **{**kwargs, "prevent_thread_lock": True})
    backend.start()
    if not kwargs.get("prevent_thread_lock"):
        demo.block_thread()
    return demo, launched


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = parse_settings(argv)
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    interpreter_bin_first()  # before import torch: TorchNeuron runs the neuronx-cc it finds on PATH
    if settings.doctor:
        from tools import doctor

        raise SystemExit(doctor.run(settings))
    configure_compile_cache(settings.cache_dir)  # before import torch (autoload) and before parallel.init
    try:
        parallel, resolve_placements, Backend, model_folder, run_follower = _import_runtime()  # noqa: N806
    except (ImportError, RuntimeError) as exc:
        message = backend_load_failure(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        raise SystemExit(3) from None
    try:
        if settings.tp > 1:  # under torchrun: --tp-engine names the sharded engine
            placement = resolve_placements(settings)[settings.tp_engine]
            # Weights first: saving (the demo build) under a process group writes only on rank 0.
            folder = model_folder(settings, settings.tp_engine)
            parallel.init(settings, placement)
            if settings.rank != 0:  # followers serve no UI: they mirror rank 0's generations
                run_follower(settings, placement, folder)
                parallel.end_process()
        backend = Backend(settings, hooks=annex_hooks(), remote=annex_remote())
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    backend.log_startup()
    try:
        import ui

        ui.own_gradio_folder(settings.port)
        launch(backend)
    finally:
        parallel.shutdown()
    if settings.tp > 1:
        parallel.end_process()


if __name__ == "__main__":
    main()
