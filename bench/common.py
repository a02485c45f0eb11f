"""What the benchmark scripts share: machine facts, tables, interleaved timing, app processes, models.

Benchmarks are not tests (STYLE.md principle 9): each script is run by hand,
``python bench/<name>.py [--quick]``, and prints its settings next to its numbers as Markdown tables
that can be pasted into docs/performance.md. Ratios are always measured in the same run, with the sides
interleaved (the order rotated and reversed from repeat to repeat), and quoted as medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
DEFAULT_ROOT = REPO / ".cache" / "bench"  # .cache/ is git-ignored

# Qwen3-0.6B's config.json: its architecture, for realistic compute with random weights.
QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                 max_position_embeddings=40960)
FULL_CHAT_DIR = "qwen3-0.6b-random-bf16"
FULL_CHAT_RECIPE = "qwen3-0.6b random bf16 v1"
# The reference for start-up and memory: a Gradio app that only imports gradio and launches (argv[1]: port).
BARE_APP = """
import sys
import gradio as gr
with gr.Blocks() as demo:
    gr.Markdown("bare")
demo.launch(server_name="127.0.0.1", server_port=int(sys.argv[1]))
"""


# ----- command line -------------------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the flags every benchmark has; also notes the machine's state at start."""
    machine()
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller shapes (a smoke run)")
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help=f"benchmark cache root (default {DEFAULT_ROOT})")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: steadier on a small shared machine)")
    return p


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


# ----- reporting ----------------------------------------------------------------------------------
_MACHINE: dict[str, str] = {}


def machine() -> dict[str, str]:
    """Where and with what the numbers were measured (taken once, at the first call)."""
    if _MACHINE:
        return dict(_MACHINE)
    import importlib.metadata as md

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for dist in ("torch", "transformers", "diffusers", "gradio", "gradio_client"):
        try:
            versions.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    _MACHINE.update({
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} cores, {_memory_gb():.0f} GB RAM, {platform.system()}",
        "python": platform.python_version(),
        "software": ", ".join(versions),
        "load average at start": f"{load} (other pytest processes: {busy_processes()})",
    })
    return dict(_MACHINE)


def _memory_gb() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except ImportError:
        return float("nan")


def busy_processes() -> int:
    """Other pytest runs on this (shared) machine, a rough noise indicator."""
    try:
        import psutil

        return sum(1 for p in psutil.process_iter(["cmdline"]) if "pytest" in " ".join(p.info["cmdline"] or []))
    except Exception:  # noqa: BLE001 - only informative
        return -1


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)]
    line = lambda values: "| " + " | ".join(str(v).ljust(w) for v, w in zip(values, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def report(title: str, settings: dict[str, object], sections: Sequence[tuple[str, str]]) -> None:
    """Print the settings table, then each (heading, table) section."""
    print(f"\n### {title}\n")
    print(table(["setting", "value"], [[k, v] for k, v in {**machine(), **settings}.items()]))
    for heading, body in sections:
        print(f"\n{heading}\n\n{body}")
    print()


def verdict(value: float, target: float, higher_is_better: bool) -> str:
    ok = value >= target if higher_is_better else value <= target
    return f"{'met' if ok else 'MISSED'} ({'≥' if higher_is_better else '≤'} {target:g})"


# ----- timing -------------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    """min-max of a series, for the tables."""
    return f"{min(values):.3g}-{max(values):.3g}" if values else "-"


def interleaved(sides: dict[str, Callable[[], dict]], repeats: int, warmups: int = 1, settle_s: float = 0.0,
                on_result: Callable[[str, int, dict], None] | None = None) -> dict[str, list[dict]]:
    """Run every side ``warmups`` untimed times, then ``repeats`` times each, interleaved.

    The order rotates on every repeat and is reversed every other round of rotations (A B C, B C A,
    C A B, C B A, ...), so each side follows each other side as often and a slow drift of the machine
    hits all sides alike. ``settle_s``: a pause before each timed run, so the leftover work of one
    side (e.g. a server finishing a request) does not land in the next side's time. Each side returns
    a dict of measurements; the lists keep repeat order.
    """
    names = list(sides)
    for _ in range(warmups):
        for name in names:
            sides[name]()
    results: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(repeats):
        shift = i % len(names)
        order = names[shift:] + names[:shift]
        for name in order[::-1] if (i // len(names)) % 2 else order:
            time.sleep(settle_s)
            result = sides[name]()
            results[name].append(result)
            if on_result is not None:
                on_result(name, i, result)
    return results


# ----- memory -------------------------------------------------------------------------------------
def peak_rss_mb(pid: int | None = None) -> float:
    """Peak resident memory (VmHWM) of a process, in MiB (this process by default)."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def rss_mb(pid: int | None = None) -> float:
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (its own threads, not its children)."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


# ----- processes and HTTP -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


class Process:
    """A child process whose stdout+stderr lines are timestamped (perf_counter) as they arrive."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path = REPO):
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(list(argv), cwd=cwd, env={**os.environ, **(env or {})}, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.perf_counter(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> float:
        """Seconds from process start to the first output line matching ``pattern``."""
        regex = re.compile(pattern)
        deadline = time.perf_counter() + timeout
        seen = 0
        with self._cond:
            while True:
                for at, line in self.lines[seen:]:
                    if regex.search(line):
                        return at - self.started
                seen = len(self.lines)
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(f"process exited ({self.proc.returncode}) before {pattern!r}:\n{self.tail()}")
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"no line matching {pattern!r} after {timeout:.0f} s:\n{self.tail()}")
                self._cond.wait(min(left, 0.5))

    def matching(self, pattern: str) -> list[str]:
        regex = re.compile(pattern)
        with self._cond:
            return [line for _, line in self.lines if regex.search(line)]

    def tail(self, n: int = 30) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_http_200(url: str, started: float, timeout: float, proc: subprocess.Popen | None = None,
                  interval: float = 0.02) -> float:
    """Seconds from ``started`` (perf_counter) until GET ``url`` answers 200."""
    deadline = started + timeout
    while time.perf_counter() < deadline:
        if http_ok(url, timeout=1.0):
            return time.perf_counter() - started
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}) before {url} answered")
        time.sleep(interval)
    raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f} s")


def app_command(*flags: str) -> list[str]:
    """``python app.py`` with these flags (run from the repository root)."""
    return [sys.executable, str(REPO / "app.py"), *flags]


# ----- models -------------------------------------------------------------------------------------
def ensure_full_size_chat(root: Path) -> Path:
    """The Qwen3-0.6B architecture with random bf16 weights and the tiny demo tokenizer, built once.

    Token ids beyond the tokenizer exist in the embedding but are never emitted: the rows of every
    token except the demo words (each a space and a word) are scaled down, so greedy decoding picks
    whole words and the streamer sends text at every token, like a real model's output. The compute
    per token is the full model's (the whole 151936-row LM head is still multiplied).
    """
    folder = Path(root) / FULL_CHAT_DIR
    marker = folder / ".complete"
    if marker.is_file() and marker.read_text().strip() == FULL_CHAT_RECIPE:
        return folder
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from tools.demo_models.build import DEMO_WORDS, ENDOFTEXT, IM_END, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    endoftext, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    words = tokenizer.convert_tokens_to_ids(["Ġ" + w for w in DEMO_WORDS])
    config = Qwen3Config(**QWEN3_06B, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext, dtype="bfloat16")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight  # tied with the LM head: [vocab, hidden]
        keep = torch.zeros(embedding.shape[0], dtype=torch.bool)
        keep[words] = True
        embedding[~keep] *= 0.01
    model.generation_config = GenerationConfig(bos_token_id=endoftext, eos_token_id=[im_end, endoftext],
                                               pad_token_id=endoftext, do_sample=False)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    marker.write_text(FULL_CHAT_RECIPE + "\n")
    return folder


def bytes_per_token(model, window: int) -> tuple[int, int]:
    """(weight bytes, KV-cache bytes) one batch-1 decode step of a causal LM reads: every weight once (a tied
    embedding is the LM head: read whole once), keys and values of ``window`` positions in every layer."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() skips tied repeats
    c = model.config
    kv = c.num_hidden_layers * 2 * c.num_key_value_heads * window * c.head_dim * model.dtype.itemsize
    return weights, kv


def ensure_demo_models(root: Path):
    from tools.demo_models.build import ensure_demo_models as build

    return build(Path(root))


def run_warm_up(backend) -> float:
    """Run a Backend's warm-up plan in this thread; return its seconds, or exit if a task failed."""
    started = time.perf_counter()
    backend.runner.run()
    failed = [f"{t.name}: {t.error}" for t in backend.runner.tasks if t.state != "ready"]
    if failed:
        raise SystemExit(f"warm-up failed: {failed}")
    return time.perf_counter() - started
