"""One phase of the first-device check, run in a process of its own: warm up, count, compare.

``python -m tools.device_check.phase --role cold|warm|aot --result OUT.json -- [app flags]``. The report
(``report.py``) starts it twice, each a fresh process on a fresh cache root: ``cold`` warms up one
chat bucket and one image size from nothing, records the compile cache (the manifest a bundle
needs) and runs the parity checks; ``warm`` installs the cold phase's bundle (``--cache-bundle``
among the app flags) and warms up the same shapes, so the persistent-cache hits and misses say what
the bundle brought. Then ``aot`` runs twice on a third root with ``--chat-aot on --image-aot on``: the
first saves the compiled forwards (or says why not), the second loads them. Each phase is a process of
its own because the Neuron runtime holds the cores of
a process until it exits, and because a fresh process is the only honest test of an on-disk cache
(dynamo and TorchNeuron also keep what they compiled in memory).

As in ``app.py``, this interpreter's folder goes first on ``PATH`` (TorchNeuron runs the
``neuronx-cc`` it finds there) and the compile-cache variables are set before ``import torch``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tools.aot import plugin as saved_forwards  # --chat-aot, --image-aot (imports no torch)
from tools.cache import plugin as cache  # the warm phase's --cache-bundle (imports no torch)
from tools.chat_batch import plugin as chat_batch  # --chat-batch, narrowed to 1 (imports no torch)
from tools.demo_models import plugin as demo_models  # --models tiny: the check on a host without weights
from tools.parallel import plugin as tensor_parallel  # --tp, refused by the report (imports no torch)

ROLES = ("cold", "warm", "aot")  # aot: the saved-forwards variant (report.saved_forwards_phases)
# the plug-ins whose flags and parts a phase takes
PLUGINS = (demo_models, cache, saved_forwards, chat_batch, tensor_parallel)


def _tasks(backend) -> list[dict]:
    return [{"name": str(t.name), "engine": t.engine, "kind": t.kind, "shape": t.shape, "state": t.state,
             "seconds": None if t.seconds is None else round(t.seconds, 3), "cache_hit": t.cache_hit,
             "error": None if t.error is None else str(t.error), "detail": None if t.detail is None else str(t.detail),
             "compiler_runs": t.compiler_runs}
            for t in backend.runner.tasks]


def _warm_up_seconds(tasks: list[dict], engine: str, edit: bool = False) -> dict | None:
    """The compile task of ``engine``'s one shape (``edit``: the image's edit slot): shape, seconds, state; None
    when the engine is off."""
    found = [t for t in tasks if t["engine"] == engine and t["kind"] == "compile"
             and ("+" in (t["shape"] or "")) == edit]  # an edit slot's label: "1024x1024+1ref"
    if not found:
        return None
    t = found[0]
    return {"shape": t["shape"], "seconds": t["seconds"], "state": t["state"], "cache_hit": t["cache_hit"],
            "error": t["error"], "compiler_runs": t["compiler_runs"]}


def _saved_forwards(backend) -> dict:
    """Per engine, its compiled forwards saved whole and loaded (``--chat-aot``/``--image-aot``), the call keys
    whose ahead-of-time compile was refused (they ran the plain compiled call), and those compiled whose save was
    refused (they served compiled, unsaved) with the distinct errors; None where it is off."""
    out = {}
    for name in backend.placements:
        try:
            forwards = getattr(backend.engine(name), "saved_forwards", None)
        except Exception:  # noqa: BLE001 - an engine that did not load: its error is in the tasks
            forwards = None
        out[name] = None if forwards is None else {"saved": forwards.saved, "loaded": forwards.loaded,
                                                   "refused": forwards.refused,
                                                   "refused_saves": forwards.refused_saves,
                                                   "save_errors": sorted(set(forwards.save_errors.values()))}
    return out


def reported_core_memory() -> dict:
    """Per core this process sees, the total memory ``torch.neuron`` reports (``get_device_properties(i)
    .total_memory``: the runtime's limit for that core, 0 where its query failed); skipped off Neuron."""
    import torch

    neuron = getattr(torch, "neuron", None)
    if neuron is None:
        return {"skipped": "no torch.neuron in this process: no NeuronCore to read"}
    out: dict = {}
    for index in range(neuron.device_count()):
        try:
            out[f"neuron:{index}"] = int(neuron.get_device_properties(index).total_memory)
        except Exception as exc:  # noqa: BLE001 - what the runtime answered is the finding
            out[f"neuron:{index}"] = f"{type(exc).__name__}: {exc}"
    return out


def dynamo_metrics() -> dict:
    """What ``torch.neuron.get_dynamo_metrics()`` reports after the warm-up (per compiled graph, its compile
    times, in TorchNeuron's source); skipped where it is missing. It synchronises: called once no request runs."""
    import torch

    read = getattr(getattr(torch, "neuron", None), "get_dynamo_metrics", None)
    if read is None:
        return {"skipped": "torch.neuron.get_dynamo_metrics is not there (not Neuron, or not this release)"}
    try:
        return {"metrics": json.loads(json.dumps(read(), default=str))}
    except Exception as exc:  # noqa: BLE001 - what it raised is the finding
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_phase(settings, role: str, host=None) -> dict:
    """Warm up ``settings``' shapes in a Backend with the bundle hook; the cold role adds parity.

    ``host``: the devices to use (default: detected). Returns plain data (see docs/trainium.md)."""
    from neuron_backend import devices
    from neuron_backend.compile_cache import CompileCounter, use_neuron_counters
    from neuron_backend.plugins import plug_all
    from neuron_backend.runtime import Backend
    from tools.cache import warm_start

    from . import parity

    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    backend = Backend(settings, host, plug_all(PLUGINS, settings))  # its bundle installed, the cache recorded
    if any(p.kind == "neuron" for p in backend.placements.values()):
        use_neuron_counters()  # TorchNeuron's metrics: every NEFF, eager or graph, and the NEFF cache's hits
    started = time.perf_counter()
    backend.runner.run()
    warm_up_s = time.perf_counter() - started
    hits, misses = CompileCounter.cache_hits()
    hook = warm_start.of(backend)
    hook.record()  # the manifest (only shapes that warmed up) and torch's artifacts: what a bundle carries
    tasks = _tasks(backend)
    result = {
        "role": role, "cache_root": str(settings.cache_dir),
        "placements": {name: {"label": p.label(), "kind": p.kind, "core": p.core}
                       for name, p in backend.placements.items()},
        "accelerator": backend.description["accelerator"], "warm_up_s": round(warm_up_s, 3), "tasks": tasks,
        "chat_warm_up": _warm_up_seconds(tasks, "chat"), "image_warm_up": _warm_up_seconds(tasks, "image"),
        "image_edit_warm_up": _warm_up_seconds(tasks, "image", edit=True),
        "persistent_cache": {"hits": hits, "misses": misses, "counter": str(CompileCounter.source()),
                             "graphs_compiled": CompileCounter.graphs()},
        "saved_forwards": _saved_forwards(backend),
        "dynamo_metrics": dynamo_metrics(),
    }
    if hook.report is not None:
        r = hook.report
        result["bundle_install"] = {"source": r.source, "usable_graphs": r.usable_graphs, "total_graphs":
                                    r.total_graphs, "mismatches": [str(m) for m in r.mismatches],
                                    "installed_files": r.installed_files, "present_files": r.present_files}
    if role == "cold":
        result["parity"] = parity.run(backend)
    result["memory"] = devices.device_counters(backend.placements)["memory"]
    result["core_memory"] = reported_core_memory()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.device_check.phase", description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--result", type=Path, required=True, help="where to write this phase's JSON")
    parser.add_argument("app_flags", nargs=argparse.REMAINDER, help="-- then the app's flags")
    args = parser.parse_args(argv)
    flags = args.app_flags[1:] if args.app_flags[:1] == ["--"] else args.app_flags

    from neuron_backend.compile_cache import configure_compile_cache  # imports no torch
    from neuron_backend.neuron_install import interpreter_bin_first
    from neuron_backend.settings import parse_settings

    settings = parse_settings(flags, plugins=PLUGINS)
    interpreter_bin_first()
    configure_compile_cache(settings.cache_dir)  # before import torch (autoload reads it)
    result = run_phase(settings, args.role)
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
