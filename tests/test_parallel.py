"""Tensor-parallel chat under torchrun on CPU (gloo): same replies as unsharded, stop in lockstep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from neuron_backend import parallel
    from neuron_backend.chat import ChatRequest
    from neuron_backend.devices import resolve_placements
    from neuron_backend.runtime import Backend, model_folder
    from neuron_backend.settings import parse_settings

    tp = sys.argv[2]
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--no-image", "--tp", tp,
                               "--cache-dir", sys.argv[1]])
    placement = resolve_placements(settings)["chat"]
    folder = model_folder(settings, "chat")  # before the group, as app.py does
    parallel.init(settings, placement)
    if settings.rank != 0:
        served = parallel.run_follower(settings, placement, folder)
        print(json.dumps({"rank": settings.rank, "served": served}))
        sys.exit(0)
    backend = Backend(settings)
    backend.runner.run()  # the warm-up generations run in lockstep too
    replies = []
    for request in (ChatRequest("hello there", greedy=True, max_new_tokens=12),
                    ChatRequest("tell me a story", temperature=1.0, top_k=0, top_p=1.0, seed=7, max_new_tokens=16),
                    ChatRequest("another", temperature=1.0, seed=123, max_new_tokens=10, history=(
                        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "demo demo"}))):
        replies.append(list(backend.stream_chat(request))[-1].answer)
    stream = backend.stream_chat(ChatRequest("stop me", temperature=1.0, seed=9, max_new_tokens=60))
    next(stream), next(stream)
    stream.close()  # the user stops: every rank must stop at the same token
    replies.append(list(backend.stream_chat(ChatRequest("after the stop", greedy=True, max_new_tokens=6)))[-1].answer)
    status = backend.status()
    parallel.shutdown()
    print(json.dumps({"rank": 0, "replies": replies, "ready": status["ready"],
                      "failed": status["failed"], "label": backend.placements["chat"].label()}))
""")


def run(tmp_path, nproc: int) -> list[dict]:
    script = tmp_path / "tp_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, str(script), str(tmp_path / "cache"), "1"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
               str(script), str(tmp_path / "cache"), str(nproc)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return sorted((json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")),
                  key=lambda r: r["rank"])


@pytest.mark.slow
def test_tensor_parallel_chat_matches_unsharded_and_followers_exit(tmp_path):
    single = run(tmp_path, 1)[0]
    leader, follower = run(tmp_path, 2)
    assert leader["ready"] and not leader["failed"]
    assert "tensor parallel ×2" in leader["label"]
    assert leader["replies"] == single["replies"]  # greedy and seeded sampling alike
    assert all(reply.strip() for reply in leader["replies"])
    # 3 warm-up generations (one per bucket) + 3 replies + the stopped one + 1 after it
    assert follower == {"rank": 1, "served": 8}


def test_tp_flag_needs_torchrun():
    from neuron_backend.errors import ConfigError
    from neuron_backend.settings import parse_settings

    with pytest.raises(ConfigError, match=r"--tp: --tp 2 needs 2 processes.*torchrun --nproc_per_node=2"):
        parse_settings(["--models", "tiny", "--tp", "2"], env={})
    s = parse_settings(["--models", "tiny", "--tp", "2"], env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert (s.tp, s.rank, s.local_rank, s.world_size) == (2, 1, 1, 2)
    with pytest.raises(ConfigError, match="--no-chat"):
        parse_settings(["--models", "tiny", "--tp", "2", "--no-chat"], env={"WORLD_SIZE": "2"})


def test_tp_placement_on_neuron_uses_the_local_core(monkeypatch):
    import types

    import torch

    from neuron_backend.devices import resolve_placements
    from neuron_backend.settings import parse_settings

    monkeypatch.setattr(torch, "neuron", types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2),
                        raising=False)
    s = parse_settings(["--models", "tiny", "--tp", "2"], env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    chat = resolve_placements(s)["chat"]
    assert chat.device == "neuron:1" and chat.tp == 2 and chat.process_group_backend == "neuron"
