"""The first-device check (tools/device_check/): its report end to end on CPU, its parity, its neuron branch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from support import fake_neuron
from support.cache_env import COMPILE_CACHE_VARIABLES

from neuron_backend import devices
from neuron_backend.compile_cache import CompileCounter
from neuron_backend.settings import parse_settings
from tools.device_check import parity, report

ROOT = Path(__file__).resolve().parents[2]
SMALL = ("--models", "tiny", "--sizes", "64x64", "--chat-buckets", "64", "--context-length", "256",
         "--max-new-tokens", "32")


def test_first_divergence_names_the_first_differing_token():
    assert parity.first_divergence([5, 6, 7], [5, 6, 7]) == "none"
    assert parity.first_divergence([5, 6, 7], [5, 9, 7]) == 1
    assert parity.first_divergence([4], [5]) == 0
    assert parity.first_divergence([5, 6], [5, 6, 7]) == 2  # one side stopped early


def test_psnr_is_inf_for_the_same_image_and_finite_for_another():
    a = Image.new("RGB", (8, 8), (100, 100, 100))
    b = Image.new("RGB", (8, 8), (110, 100, 100))  # one channel off by 10: MSE 100/3
    assert parity.psnr(a, a.copy()) == "inf"
    assert parity.psnr(a, b) == pytest.approx(10 * __import__("math").log10(255**2 / (100 / 3)), abs=1e-3)
    with pytest.raises(ValueError, match="different sizes"):
        parity.psnr(a, Image.new("RGB", (4, 8)))


@pytest.fixture
def cpu_settings(tmp_path, demo_models):
    return parse_settings([*SMALL, "--device", "cpu", "--cache-dir", str(tmp_path)], env={})


def test_parity_is_none_against_the_same_model_and_finds_a_perturbed_one(cpu_settings, demo_models):
    ours = parity.reference_engine(cpu_settings, "chat", demo_models.chat, "demo")
    same = parity.reference_engine(cpu_settings, "chat", demo_models.chat, "demo")
    result = parity.chat_parity(ours, same, tokens=8)
    assert result["all_match"] and [r["first_divergence"] for r in result["prompts"]] == ["none"] * 3
    assert all(len(r["device_ids"]) == 8 for r in result["prompts"])
    with torch.no_grad():  # negated final norm: the logits flip sign, so greedy picks another token at once
        same.model.model.norm.weight.neg_()
    result = parity.chat_parity(ours, same, tokens=8)
    assert not result["all_match"]
    assert [r["first_divergence"] for r in result["prompts"]] == [0, 0, 0]


@pytest.mark.slow
def test_image_parity_is_inf_against_the_same_pipeline_and_finite_when_perturbed(cpu_settings, demo_models):
    ours = parity.reference_engine(cpu_settings, "image", demo_models.image, "demo")
    same = parity.reference_engine(cpu_settings, "image", demo_models.image, "demo")
    assert parity.image_parity(ours, same, "64x64", steps=1)["psnr_db"] == "inf"
    with torch.no_grad():
        for p in same._pipe.vae.decoder.conv_out.parameters():
            p.mul_(1.5)
    found = parity.image_parity(ours, same, "64x64", steps=1)["psnr_db"]
    assert isinstance(found, float) and 0 < found < 60


@pytest.mark.slow
def test_the_check_runs_end_to_end_on_cpu_and_reports_every_part(tmp_path):
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in COMPILE_CACHE_VARIABLES}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tools.doctor", "--device-check", "--out", str(out), *SMALL,
                           "--cache-dir", str(tmp_path / "root")], cwd=ROOT, capture_output=True, text=True,
                          timeout=360, env={**env, "HF_HUB_OFFLINE": "1"})
    took = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "report written to" in done.stdout
    r = json.loads(out.read_text())
    assert took < 180 and 0 < r["wall_s"] < took  # five processes: two phases, two saved-forwards phases, doctor
    assert r["format"] == 1 and r["command"].startswith("python -m tools.doctor --device-check --out")
    assert r["versions"]["torch"] == torch.__version__ and r["versions"]["torch-neuronx"] is None
    assert "transformers" in r["versions"] and "diffusers" in r["versions"] and "neuronx-cc" in r["versions"]
    assert r["neuron_ls"] == {"skipped": "neuron-ls is not on PATH (no Neuron SDK tools on this host)"}
    assert r["settings"]["chat_bucket"] == 64 and r["settings"]["image_size"] == "64x64"
    # one bucket and one size, warmed up cold, with their seconds
    chat, image = r["warm_up"]["chat"], r["warm_up"]["image"]
    assert (chat["shape"], chat["state"], image["shape"], image["state"]) == ("prefill-64", "ready", "64x64", "ready")
    assert chat["seconds"] > 0 and image["seconds"] > 0
    assert [t["kind"] for t in r["cold"]["tasks"]].count("compile") == 3
    edit = r["warm_up"]["image_edit"]  # one edit with one reference, at the size (1024x1024 at the full preset)
    assert (edit["shape"], edit["state"]) == ("64x64+1ref", "ready") and edit["seconds"] > 0
    assert r["cold"]["saved_forwards"] == {"chat": None, "image": None}  # eager here: nothing compiled to save
    assert r["core_memory"] == {"skipped": "no torch.neuron in this process: no NeuronCore to read"}
    assert "skipped" in r["cold"]["dynamo_metrics"]  # no torch.neuron here
    assert all("compiler_runs" in t for t in r["cold"]["tasks"]) and "compiler_runs" in chat
    # the saved-forwards variant, a phase of its own twice over: eager on CPU, so nothing to save or load
    aot = r["saved_forwards"]
    assert aot["flags"] == "--chat-aot on --image-aot on"
    assert aot["save"]["saved_forwards"] == aot["load"]["saved_forwards"] == {"chat": None, "image": None}
    assert aot["save"]["warm_up"]["chat"]["state"] == aot["load"]["warm_up"]["image"]["state"] == "ready"
    # parity: CPU against CPU agrees, token for token and pixel for pixel
    p = r["parity"]
    assert [row["first_divergence"] for row in p["chat"]["prompts"]] == ["none"] * 3
    assert all(len(row["device_ids"]) == 32 == len(row["reference_ids"]) for row in p["chat"]["prompts"])
    assert p["image"]["psnr_db"] == "inf" and p["image"]["size"] == "64x64"
    assert "compares cpu with cpu" in p["note"]
    # the bundle: exported from the cold root, installed into the warm one, every shape usable
    b = r["bundle"]
    assert re.fullmatch(r"[0-9a-f]{64}", b["export"]["sha256"]) and b["export"]["bytes"] > 0
    assert b["export"]["shapes"] == {"chat": ["prefill-64"], "image": ["64x64", "64x64+1ref"]}
    assert b["install"]["usable_graphs"] == b["install"]["total_graphs"] == 3 and b["install"]["mismatches"] == []
    assert b["mode"].startswith("a fresh cache root at another path")
    assert b["warm"]["cache_root"] != r["cold"]["cache_root"]
    assert {"hits", "misses", "counter"} <= set(b["persistent_cache_after_warm_up"])
    assert b["warm_up"]["chat"]["state"] == b["warm_up"]["image"]["state"] == "ready"
    # the doctor, and every skip with its reason
    assert r["doctor"]["exit"] == 0 and {"python", "import torch"} <= {c["name"] for c in r["doctor"]["checks"]}
    parts = {s["part"]: s["reason"] for s in r["skipped"]}
    assert {"neuron_ls", "memory", "parity"} <= set(parts) and all(parts.values())
    assert r["work_folder"] is None and not any((tmp_path / "root" / "device-check").iterdir())


SLEEPER = """#!{python}
import subprocess, sys, time
child = subprocess.Popen(["{compiler}"])  # a stuck neuronx-cc, as TorchNeuron would start it
open("{pids}", "w").write(str(child.pid))
time.sleep(600)
"""


@pytest.mark.slow
def test_a_phase_past_its_time_limit_is_killed_with_its_compiler(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "KILL_GRACE_S", 1)  # the compiler below waits out SIGTERM's grace
    compiler = tmp_path / "bin" / "neuronx-cc"
    compiler.parent.mkdir()
    compiler.write_text("#!/bin/sh\ntrap '' TERM\nexec sleep 600\n")  # deaf to SIGTERM: only SIGKILL ends it
    compiler.chmod(0o755)
    pids = tmp_path / "pids"
    python = tmp_path / "python"
    python.write_text(SLEEPER.format(python=sys.executable, compiler=compiler, pids=pids))
    python.chmod(0o755)
    started = time.perf_counter()
    result = report.run_phase("cold", [], tmp_path, str(python), timeout_s=3)
    assert "ran past" in result["error"] and time.perf_counter() - started < 30
    pid = int(pids.read_text())  # ended when the phase's result comes (a zombie: ended, left to be reaped)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.fixture
def neuron(monkeypatch):
    """Two fake NeuronCores (tests/support/fake_neuron.py); engines hold CPU tensors on placements that say neuron."""
    torch._dynamo.reset()
    fake = fake_neuron.install(monkeypatch, cores=2)
    monkeypatch.setattr(CompileCounter, "mode", "auto")
    fake_neuron.cpu_backed_placements(monkeypatch)
    fake_neuron.place_on_load(monkeypatch, fake)
    yield fake
    torch._dynamo.reset()


@pytest.mark.slow
def test_with_the_fake_neuron_runtime_the_cold_phase_compares_neuron_with_cpu(neuron, tmp_path, demo_models):
    from tools.device_check import phase

    settings = parse_settings([*SMALL, "--cache-dir", str(tmp_path)], env={})
    result = phase.run_phase(settings, "cold", host=devices.HostDevices(neuron_cores=2, cuda_devices=0))
    where = {name: (p["kind"], p["core"]) for name, p in result["placements"].items()}
    assert where == {"chat": ("neuron", 0), "image": ("neuron", 1)}
    assert result["chat_warm_up"]["state"] == result["image_warm_up"]["state"] == "ready"
    chat, image = result["parity"]["chat"], result["parity"]["image"]
    assert (chat["device_kind"], chat["device_core"], image["device_kind"], image["device_core"]) == \
        ("neuron", 0, "neuron", 1)
    assert chat["device"].endswith("compiled (neuron)") and chat["reference"] == "cpu · float32 · eager"
    assert [row["first_divergence"] for row in chat["prompts"]] == ["none"] * 3
    assert "note" not in result["parity"]
    assert isinstance(result["parity"]["image"]["psnr_db"], (float, str))
    assert set(result["memory"]) == {"neuron:0", "neuron:1"}
    assert result["memory"]["neuron:0"]["total_bytes"] == fake_neuron.REPORTED_TOTAL
    assert "TorchNeuron" in result["persistent_cache"]["counter"]
    assert {core for core, _ in neuron.compiled_calls} == {0, 1}  # the compiled graphs ran on both cores
    assert (tmp_path / "compile-cache" / "manifest.json").is_file()  # recorded: what a bundle would carry


def test_a_phase_reports_each_engines_saved_forwards():
    from types import SimpleNamespace

    from neuron_backend.errors import EngineUnavailableError
    from tools.device_check.phase import _saved_forwards

    # an AotForward's counts, as a Neuron cold phase may have them: two keys whose save raised the same error
    why = "TypeError: cannot pickle '_thread.lock' object"
    forwards = SimpleNamespace(saved=2, loaded=0, refused=1, refused_saves=2, save_errors={"k1": why, "k2": why})

    def engine(name):
        if name == "image":
            raise EngineUnavailableError("the image engine failed to load")
        return SimpleNamespace(saved_forwards=forwards)

    backend = SimpleNamespace(placements={"chat": None, "image": None}, engine=engine)
    assert _saved_forwards(backend) == {"chat": {"saved": 2, "loaded": 0, "refused": 1, "refused_saves": 2,
                                                 "save_errors": [why]}, "image": None}


def test_the_report_keeps_neuron_ls_json_output_whole_when_it_cannot_read_it(neuron_ls):
    from tools import neuron_ls as tool

    neuron_ls("2.34-unread", devices=2)
    found = tool.output()
    assert found["command"] == "neuron-ls" and found["json"] is None  # the plain table answered
    raw = found["output_format_json"]
    assert raw["exit"] == 0 and not raw["cut"]
    assert json.loads(raw["stdout"])["hardware"]["1"]["nc_count"] == 8  # whole, for the keys to be learned
    neuron_ls("2.34", devices=2)
    found = tool.output()
    assert found["command"] == "neuron-ls --output-format json" and found["output_format_json"]["stdout"]


def test_a_phase_records_the_total_memory_torch_neuron_reports_per_core(monkeypatch):
    from tools.device_check.phase import reported_core_memory

    fake_neuron.install(monkeypatch, cores=2)
    assert reported_core_memory() == {"neuron:0": fake_neuron.REPORTED_TOTAL, "neuron:1": fake_neuron.REPORTED_TOTAL}
    monkeypatch.delattr(torch, "neuron")
    assert "skipped" in reported_core_memory()
