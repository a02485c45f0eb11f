"""Image throughput through a page with one image worker and with two (--image-server), on the tiny models.

    python bench/image_workers.py                      # 16 clients x 2 images, 50 steps, 2 rounds per side
    python bench/image_workers.py --quick              # 4 clients x 1 image, 8 steps, 1 round: a check
    python bench/image_workers.py --out figures.json

Starts two image workers (``app.py --no-chat``, 96x64) and two pages in front of them as subprocesses on
127.0.0.1: one page routes to the first worker only, the other to both. Each worker runs torch on one thread
(``OMP_NUM_THREADS=1``), as each Trainium worker holds one NeuronCore: two workers then have a core each on a
2-core host. The sides run interleaved (one worker, two workers, one, two, ...); in each round N client threads
(one ``gradio_client.Client`` each) ask the page for their images one after another. Throughput is images made
over the wall time from the first request to the last result; startup and warm-up are not counted. It also
counts which worker made each image (the PNG parameters' ``worker``). Bounded: every round ends by --timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
SIZE = "96x64"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(root: Path, name: str, *flags: str, threads: int | None = None) -> tuple[str, subprocess.Popen]:
    port = free_port()
    cmd = [sys.executable, "app.py", "--models", "tiny", "--device", "cpu", "--cache-dir", str(root / name),
           "--port", str(port), "--sizes", SIZE, "--max-steps", "200", "--queue-size", "64",
           "--max-session-jobs", "64", *flags]
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    log = open(root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process's folder
    return f"http://127.0.0.1:{port}", subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen, deadline: float) -> None:
    """Until the app's /readyz answers 200: every engine warm (a page: every worker connected)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as answer:  # noqa: S310 - loopback only
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} was not ready in time")


def one_round(page: str, clients: int, images: int, steps: int, timeout: float) -> dict:
    """``clients`` threads, each asking ``page`` for ``images`` images one after another."""
    made: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    sessions = [Client(page, verbose=False) for _ in range(clients)]
    deadline = time.monotonic() + timeout

    def client(index: int) -> None:
        for i in range(images):
            if time.monotonic() > deadline:
                return
            try:
                _, params = sessions[index].predict(prompt=f"client {index} image {i}", size=SIZE, steps=steps,
                                                    seed=index * 100 + i, api_name="/generate_image")
                with lock:
                    made.append(params["worker"])
            except Exception as exc:  # noqa: BLE001 - counted and shown: a bench reports, it does not stop
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 5)
    wall = time.perf_counter() - started
    return {"images": len(made), "wall_s": round(wall, 2), "images_per_s": round(len(made) / wall, 3),
            "by_worker": dict(Counter(made)), "errors": errors[:5]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--images-per-client", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side, interleaved")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one round may take")
    parser.add_argument("--quick", action="store_true", help="4 clients x 1 image, 8 steps, 1 round")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.images_per_client, args.steps, args.rounds = 4, 1, 8, 1
    root = Path(tempfile.mkdtemp(prefix="image-workers-"))
    procs: list[subprocess.Popen] = []
    try:
        first = start(root, "worker-1", "--no-chat", threads=1)
        second = start(root, "worker-2", "--no-chat", threads=1)
        procs += [first[1], second[1]]
        deadline = time.monotonic() + 300
        for url, proc in (first, second):
            wait_ready(url, proc, deadline)
        pages = {1: start(root, "page-1-worker", "--no-chat", "--image-server", first[0]),
                 2: start(root, "page-2-workers", "--no-chat", "--image-server", f"{first[0]},{second[0]}")}
        procs += [proc for _, proc in pages.values()]
        for url, proc in pages.values():
            wait_ready(url, proc, deadline)
        rounds = []
        for r in range(args.rounds):
            for workers in (1, 2):  # interleaved: a slower machine later in the run slows both sides
                result = one_round(pages[workers][0], args.clients, args.images_per_client, args.steps, args.timeout)
                rounds.append({"round": r + 1, "workers": workers, **result})
                print(json.dumps(rounds[-1]), flush=True)
        ratios = [two["images_per_s"] / one["images_per_s"] for one, two in zip(rounds[::2], rounds[1::2], strict=True)
                  if one["images_per_s"]]
        summary = {"clients": args.clients, "images_per_client": args.images_per_client, "steps": args.steps,
                   "size": SIZE, "cpus": os.cpu_count(), "rounds": rounds,
                   "ratio_2_over_1": [round(r, 3) for r in ratios],
                   "median_ratio": round(statistics.median(ratios), 3) if ratios else None}
        print(f"2 workers / 1 worker, images per second: median {summary['median_ratio']} "
              f"(rounds: {summary['ratio_2_over_1']})")
        if args.out:
            args.out.write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
