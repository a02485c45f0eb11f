"""Load test: many concurrent gradio_client users against the app on the tiny models (loopback only).

    python bench/load.py                 # 16 clients, 208 requests
    python bench/load.py --clients 4 --requests 40

Starts `app.py --models tiny` as a subprocess on 127.0.0.1, waits for warm-up, then runs a fixed,
seeded mix of chat and image requests from N threads (one Client each). Every request either
completes or is refused by the bounded queue; anything else counts as an error. Bounded in count
and time: it stops by itself. Prints latency percentiles, refusals and the server's RSS.
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, cache: str, queue_size: int) -> subprocess.Popen:
    cmd = [sys.executable, "app.py", "--models", "tiny", "--device", "cpu", "--cache-dir", cache, "--port",
           str(port), "--sizes", "64x64,96x64", "--max-new-tokens", "32", "--queue-size", str(queue_size)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_ready(url: str, deadline: float) -> Client:
    while time.time() < deadline:
        try:
            client = Client(url, verbose=False)
            if client.predict(api_name="/status")["ready"]:
                return client
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    raise TimeoutError("the app did not become ready in time")


def one_request(client: Client, rng: random.Random) -> str:
    if rng.random() < 0.5:
        reply = client.predict(message=f"question {rng.randint(0, 999)}", max_new_tokens=rng.choice([8, 16, 32]),
                               seed=rng.randint(0, 99), api_name="/chat")
        assert reply["done"]
        return "chat"
    _, params = client.predict(prompt=f"picture {rng.randint(0, 999)}", size=rng.choice(["64x64", "96x64"]),
                               steps=rng.choice([1, 2, 4]), seed=rng.randint(0, 99), guidance=None,
                               api_name="/generate_image")
    assert params["seed"] is not None
    return "image"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=208)
    parser.add_argument("--queue-size", type=int, default=16)
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds before the test gives up")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    server = start_server(port, tempfile.mkdtemp(prefix="load-"), args.queue_size)
    deadline = time.time() + args.time_limit
    results: list[tuple[int, str, str, float]] = []  # (order, kind, outcome, seconds)
    lock = threading.Lock()
    counter = iter(range(args.requests))
    try:
        wait_ready(url, time.time() + 300)
        proc = psutil.Process(server.pid)
        rss = {"start": proc.memory_info().rss}

        def user(index: int) -> None:
            rng = random.Random(index)
            client = Client(url, verbose=False)
            while time.time() < deadline:
                with lock:
                    order = next(counter, None)
                if order is None:
                    return
                started = time.perf_counter()
                try:
                    kind, outcome = one_request(client, rng), "ok"
                except Exception as exc:  # noqa: BLE001 - classified below
                    text = str(exc).lower()
                    kind, outcome = "?", "refused" if "queue is full" in text or "busy" in text else f"error: {exc}"
                with lock:
                    results.append((order, kind, outcome, time.perf_counter() - started))
                    if len(results) == 50:
                        rss["after 50"] = proc.memory_info().rss

        threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, deadline - time.time()))
        wall = time.perf_counter() - t0
        rss["end"] = proc.memory_info().rss
        hung = sum(t.is_alive() for t in threads)
        alive = server.poll() is None
    finally:
        server.terminate()
        server.wait(30)
    report(args, results, rss, wall, hung, alive)


def report(args, results, rss, wall, hung, alive) -> None:
    ok = [r for r in results if r[2] == "ok"]
    refused = [r for r in results if r[2] == "refused"]
    errors = [r for r in results if r[2].startswith("error")]

    def pct(values, q):
        return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else (values[0] if values else 0.0)

    print(f"settings: clients={args.clients} requests={args.requests} queue_size={args.queue_size} "
          f"models=tiny device=cpu (loopback)")
    print(f"{'kind':<8}{'ok':>6}{'p50 s':>9}{'p95 s':>9}")
    for kind in ("chat", "image"):
        times = [r[3] for r in ok if r[1] == kind]
        print(f"{kind:<8}{len(times):>6}{pct(times, 50):>9.2f}{pct(times, 95):>9.2f}")
    print(f"completed {len(ok)}, refused by the queue {len(refused)}, errors {len(errors)}, "
          f"hung clients {hung}, server alive {alive}, wall {wall:.1f} s")
    for _, _, outcome, _ in errors[:5]:
        print("  ", outcome[:200])
    mb = {k: v / 2**20 for k, v in rss.items()}
    growth = (rss["end"] - rss.get("after 50", rss["end"])) / rss.get("after 50", rss["end"]) * 100
    print("server RSS MB: " + ", ".join(f"{k} {v:.0f}" for k, v in mb.items())
          + f"; growth after the first 50 requests {growth:+.1f}% (target < 10%)")
    if errors or hung or not alive or len(results) < args.requests:
        sys.exit(1)


if __name__ == "__main__":
    main()
