"""Start-up: seconds until the page answers (HTTP 200 on /), the app vs a bare Gradio app.

- app: ``python app.py --models tiny --device cpu --cache-dir <bench root>/startup --port P``
  (the demo models are built beforehand by an untimed run);
- bare: a Gradio app that only imports gradio, builds a one-line Blocks and launches.

Both are fresh processes, polled every 20 ms from spawning; the runs alternate (the order flipped
every repeat) after one untimed run of each (OS file cache). For the app the log also says when
each model finished loading and when the warm-up ended, to check that the UI is served first.
Usage: ``python bench/startup.py [--quick] [--repeats 5]``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def start(kind: str, cache: Path) -> dict:
    port = common.free_port()
    if kind == "app":
        argv = common.app_command("--models", "tiny", "--device", "cpu", "--cache-dir", str(cache), "--port", str(port))
    else:
        argv = [sys.executable, "-c", common.BARE_APP, str(port)]
    with common.Process(argv, env={"PYTHONUNBUFFERED": "1"}) as proc:
        served = common.wait_http_200(f"http://127.0.0.1:{port}/", proc.started, timeout=300, proc=proc.proc)
        result = {"served_s": served, "cpu_s": common.cpu_seconds(proc.proc.pid)}
        if kind == "app":
            result["chat_loaded_s"] = proc.wait_for(r"warm-up done: chat · load", timeout=600)
            result["image_loaded_s"] = proc.wait_for(r"warm-up done: image · load", timeout=600)
            result["ready_s"] = proc.wait_for(r"warm-up finished", timeout=600)
    return result


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="timed starts per side (default 5; quick 2)")
    args = p.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    demo = common.ensure_demo_models(args.root)
    cache = args.root / "startup"
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "demo-models").exists():
        os.symlink(demo.chat.parent, cache / "demo-models")

    def progress(name, i, r):
        print(f"  repeat {i + 1} {name}: page after {r['served_s']:.2f} s", file=sys.stderr)

    results = common.interleaved({"bare gradio": lambda: start("bare", cache), "app": lambda: start("app", cache)},
                                 repeats, warmups=1, on_result=progress)
    med = {name: common.median([r["served_s"] for r in runs]) for name, runs in results.items()}
    app_runs = results["app"]
    loaded = [max(r["chat_loaded_s"], r["image_loaded_s"]) for r in app_runs]
    rows = [[name, f"{med[name]:.2f}", common.spread([r["served_s"] for r in runs]),
             f"{common.median([r['cpu_s'] for r in runs]):.2f}"] for name, runs in results.items()]
    cpu = {name: common.median([r["cpu_s"] for r in runs]) for name, runs in results.items()}
    cpu_ratio = cpu["app"] / cpu["bare gradio"]
    app_rows = [[f"{common.median([r[k] for r in app_runs]):.2f}", common.spread([r[k] for r in app_runs])]
                for k in ("served_s", "chat_loaded_s", "image_loaded_s", "ready_s")]
    served_first = sum(r["served_s"] < m for r, m in zip(app_runs, loaded, strict=True))
    ratio = med["app"] / med["bare gradio"]
    settings = {
        "app": "python app.py --models tiny --device cpu --cache-dir <bench root>/startup (demo models prebuilt)",
        "bare": "import gradio; gr.Blocks() with one Markdown; launch()",
        "measure": "spawn to the first HTTP 200 on / (polled every 20 ms)",
        "repeats": f"{repeats} per side after 1 untimed each, interleaved (order reversed every repeat); medians",
    }
    common.report("Start-up", settings, [
        ("Page served:", common.table(["side", "seconds (median)", "range", "CPU s of the process by then (median)"],
                                      rows)),
        ("The app's timeline (seconds from spawn, medians):", common.table(
            ["event", "seconds", "range"],
            [[e, *r] for e, r in zip(["page served", "chat model loaded", "image model loaded", "warm-up finished"],
                                     app_rows, strict=True)])),
        ("Checks (same run):", common.table(["check", "value", "target"], [
            ["app / bare", f"{ratio:.2f}", common.verdict(ratio, 1.5, False)],
            ["app / bare, CPU seconds (less sensitive to other load)", f"{cpu_ratio:.2f}", "-"],
            ["page served before both models loaded", f"{served_first}/{len(app_runs)} runs",
             "met" if served_first == len(app_runs) else "MISSED (every run)"],
        ])),
    ])


if __name__ == "__main__":
    main()
