"""Memory: peak resident memory (VmHWM) of the app process, demo models and full-size chat model.

Each configuration is a fresh ``python app.py`` process: it warms up, then serves one chat reply
(and one image) through the public API (gradio_client, from this process), then its peak RSS is
read from /proc. A bare Gradio app is measured the same way as the reference.

- bare gradio: imports gradio, one Markdown, launches;
- demo app: ``--models tiny --device cpu`` (tiny Qwen3 + tiny FLUX.2-klein, float32, eager), and the
  same with ``--compile on`` from an empty compile cache (inductor compiles in the app process);
- full-size chat: ``--models full --chat-model <Qwen3-0.6B architecture, random bf16 weights>
  --no-image --dtype bfloat16 --chat-buckets 256 --context-length 4096`` (the full preset's
  context: a 4096-token static KV cache).
Usage: ``python bench/memory.py [--quick]``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DEMO_LIMIT_MIB = 1536


def measure(argv: list[str], port: int, requests: list[tuple[str, dict]], app: bool) -> dict:
    from gradio_client import Client

    with common.Process(argv, env={"PYTHONUNBUFFERED": "1"}) as proc:
        common.wait_http_200(f"http://127.0.0.1:{port}/", proc.started, timeout=600, proc=proc.proc)
        if app:
            proc.wait_for(r"warm-up finished", timeout=1800)
        after_warmup = common.rss_mb(proc.proc.pid)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        for api_name, kwargs in requests:
            client.predict(api_name=api_name, **kwargs)
        return {"after_warmup": after_warmup, "rss": common.rss_mb(proc.proc.pid),
                "peak": common.peak_rss_mb(proc.proc.pid)}


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--skip-full", action="store_true", help="only the bare app and the demo app")
    args = p.parse_args()
    demo = common.ensure_demo_models(args.root)
    cache = args.root / "memory"
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "demo-models").exists():
        os.symlink(demo.chat.parent, cache / "demo-models")
    new_tokens = 8 if args.quick else 32
    chat = ("/chat", {"message": "Tell me about the tiny chip.", "max_new_tokens": new_tokens, "greedy": True})
    image = ("/generate_image", {"prompt": "a lighthouse", "size": "256x256", "steps": 4, "seed": 1,
                                 "guidance": None})
    configs = []
    port = common.free_port()
    configs.append(("bare gradio", [sys.executable, "-c", common.BARE_APP, str(port)], port, [], False,
                    "import gradio, one Markdown, launch"))
    port = common.free_port()
    configs.append(("demo app", common.app_command("--models", "tiny", "--device", "cpu", "--cache-dir", str(cache),
                                                   "--port", str(port)), port, [chat, image], True,
                    "--models tiny: tiny Qwen3 + tiny FLUX.2-klein, float32, eager; 1 chat reply + 1 image 256x256"))
    if not args.quick:
        compiled = args.root / "memory-compiled"
        shutil.rmtree(compiled / "compile-cache", ignore_errors=True)  # a cold start: the most memory
        compiled.mkdir(parents=True, exist_ok=True)
        if not (compiled / "demo-models").exists():
            os.symlink(demo.chat.parent, compiled / "demo-models")
        port = common.free_port()
        configs.append(("demo app, compile on", common.app_command(
            "--models", "tiny", "--device", "cpu", "--compile", "on", "--cache-dir", str(compiled), "--port",
            str(port)), port, [chat, image], True, "the same with --compile on (inductor), empty compile cache"))
    if not args.skip_full:
        folder = common.ensure_full_size_chat(args.root)
        port = common.free_port()
        configs.append(("full-size chat", common.app_command(
            "--models", "full", "--chat-model", str(folder), "--no-image", "--device", "cpu", "--dtype", "bfloat16",
            "--chat-buckets", "256", "--context-length", "4096", "--max-new-tokens", "64", "--cache-dir", str(cache),
            "--port", str(port)), port, [chat], True,
            f"Qwen3-0.6B architecture, random weights, bf16, static cache 4096 tokens; 1 chat reply of {new_tokens}"))
    rows = []
    for name, argv, port, requests, app, what in configs:
        r = measure(argv, port, requests, app)
        print(f"  {name}: peak {r['peak']:.0f} MiB", file=sys.stderr)
        target = common.verdict(r["peak"], DEMO_LIMIT_MIB, False) if name.startswith("demo app") else "-"
        rows.append([name, what, f"{r['after_warmup']:.0f}", f"{r['rss']:.0f}", f"{r['peak']:.0f}", target])
    settings = {
        "measure": "VmRSS after warm-up, VmRSS and VmHWM (peak) after the requests, of the app process",
        "requests": "through gradio_client from the benchmark process (not counted)",
    }
    common.report("Memory", settings, [("Resident memory (MiB):", common.table(
        ["configuration", "what", "RSS after warm-up", "RSS after requests", "peak RSS", "target"], rows))])


if __name__ == "__main__":
    main()
