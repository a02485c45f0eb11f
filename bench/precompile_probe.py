"""Does torch's experimental automatic precompile cache (``TORCH_CACHING_PRECOMPILE=1``: dynamo saves what it traced
and reloads it in the next process, so a warm start skips tracing) work for the chat engine's compiled graphs?

Two fresh processes on one new cache root, both with the variable set: the first warms the chat engine up on the
demo model (``--compile on``, CPU) and saves dynamo's packages; the second starts warm from them. Each prints every
warm-up task's state and seconds, and a greedy reply, so the two can be compared.

    python bench/precompile_probe.py [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_process(root: str) -> dict:
    """Warm up the chat engine under ``root``; save dynamo's packages; one greedy reply."""
    sys.path.insert(0, str(ROOT))
    import torch

    from neuron_backend import devices
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    from tools.demo_models import plugin as demo_builder

    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--compile", "on", "--no-image",
                               "--cache-dir", root], env={})
    backend = Backend(settings, host=devices.HostDevices(neuron_cores=0, cuda_devices=0),
                      parts=demo_builder.plug(settings))
    backend.runner.run()
    tasks = [{"task": str(t.name), "state": t.state, "seconds": round(t.seconds or 0.0, 2),
              "error": (t.error or "")[:200]} for t in backend.runner.tasks]
    from torch._dynamo.precompile_context import PrecompileContext

    PrecompileContext.save_to_dynamo_cache()
    from torch._dynamo.utils import counters

    try:
        final = list(backend.stream_chat({"message": "hello there", "greedy": True, "max_new_tokens": 8}))[-1]
        reply = final.answer
    except Exception as exc:  # noqa: BLE001 - the finding: what a request meets
        reply = f"{type(exc).__name__}: {exc}"[:200]
    return {"torch": torch.__version__, "tasks": tasks, "dynamo_cache": dict(counters["dynamo_cache"]),
            "reply": reply}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="cache root (default: a new temporary folder)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_process(args.child)))
        return
    root = args.root or tempfile.mkdtemp(prefix="precompile-probe-")
    env = {**os.environ, "TORCH_CACHING_PRECOMPILE": "1", "HF_HUB_OFFLINE": "1"}
    for side in ("cold", "warm"):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", root], env=env, capture_output=True, text=True,
                              timeout=900, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"## {side} (process {time.perf_counter() - started:.1f} s, torch {result['torch']})")
        for task in result["tasks"]:
            print(f"- {task['task']}: {task['state']} {task['seconds']} s {task['error']}")
        print(f"- dynamo cache counters: {result['dynamo_cache']}; reply: {result['reply']!r}")


if __name__ == "__main__":
    main()
