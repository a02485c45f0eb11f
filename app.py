"""Gradio app: Qwen3 chat and FLUX.2-klein images on AWS Trainium (or whatever this host has).

The entry point only: settings, the compile-cache folders, a sharding plug-in's process group, the ``Backend``,
``ui.serve``. ``python app.py --help`` lists every flag, ``--doctor`` checks this host. The settings, ``PATH``
and the NEFF cache variables come before ``import torch``, which is guarded (docs/trainium.md).
"""

from __future__ import annotations

import logging
import sys
from importlib import metadata

from neuron_backend.compile_cache import configure_compile_cache  # imports no torch
from neuron_backend.errors import ShowcaseError
from neuron_backend.neuron_install import interpreter_bin_first, load_failure  # imports no torch
from neuron_backend.plugins import Parts, plug_all
from neuron_backend.settings import parse_settings
from tools import doctor
from tools.aot import plugin as saved_forwards
from tools.cache import plugin as cache_bundles
from tools.chat_batch import plugin as chat_batch
from tools.conversation_files import plugin as conversation_files
from tools.demo_models import plugin as demo_models
from tools.login import plugin as login_hardening
from tools.mcp import plugin as mcp
from tools.openai_api import plugin as openai_api
from tools.parallel import plugin as tensor_parallel
from tools.paste_back import plugin as paste_back
from tools.probes import plugin as probes
from tools.qa import plugin as qa_bench
from tools.remote import plugin as remote_engines

log = logging.getLogger("showcase.app")

# Everything that is not the two models, each a module with add_flags(parser) and plug(settings) -> Parts
# (neuron_backend/plugins.py); --help lists each one's flags under its title. None of them imports torch.
# Rows under the chat come in this order: the feedback row (qa_bench), then the conversation files' row.
PLUGINS = (probes, demo_models, remote_engines, cache_bundles, saved_forwards, chat_batch, tensor_parallel,
           openai_api, login_hardening, mcp, qa_bench, conversation_files, paste_back, doctor)

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
    from neuron_backend.runtime import Backend

    return Backend


def launch(backend, parts: Parts = Parts(), **kwargs):
    """Serve the UI, then start warm-up in the background, then block (unless ``prevent_thread_lock``).

    In this order because ``launch()`` checks once that the server answers (a ``HEAD /`` with a 3 s
    timeout) and fails the start when it does not: a warm-up thread already loading gigabytes of weights
    can starve that check on a busy host."""
    import ui  # Gradio: imported here so the torchrun followers never load it

    demo, launched = ui.serve(backend, parts, **{**kwargs, "prevent_thread_lock": True})
    backend.start()
    if not kwargs.get("prevent_thread_lock"):
        demo.block_thread()
    return demo, launched


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = parse_settings(argv, plugins=PLUGINS)
        parts = plug_all(PLUGINS, settings)
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    interpreter_bin_first()  # before import torch: TorchNeuron runs the neuronx-cc it finds on PATH
    if parts.command is not None:  # e.g. --doctor: a plug-in's command instead of the app
        raise SystemExit(parts.command(settings, parts))
    configure_compile_cache(settings.cache_dir)  # before import torch (autoload) and before a process group
    try:
        Backend = _import_runtime()  # noqa: N806
    except (ImportError, RuntimeError) as exc:
        message = backend_load_failure(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        raise SystemExit(3) from None
    sharding = parts.sharding  # under torchrun: one engine sharded over the ranks
    try:
        if sharding is not None:
            sharding.join(settings, parts)  # a follower serves no UI: it mirrors rank 0's generations, then ends
        backend = Backend(settings, parts=parts)
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    backend.log_startup()
    try:
        import ui

        ui.own_gradio_folder(settings.port)
        launch(backend, parts)
    finally:
        if sharding is not None:
            sharding.release()
    if sharding is not None:
        sharding.end()


if __name__ == "__main__":
    main()
