"""First run from the command line: the doctor, a broken torch-neuronx, the install pins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import doctor

ROOT = Path(__file__).resolve().parents[2]

# An installed "torch-neuronx" whose autoload entry point records the NEFF cache variables it sees,
# then fails the way a torch / torch-neuronx mismatch does (an undefined C++ symbol).
BROKEN_EXTENSION = '''
import json, os
def _autoload():
    with open(os.environ["RECORD_AUTOLOAD"], "w") as f:
        json.dump({k: os.environ.get(k) for k in ("TORCH_NEURONX_NEFF_CACHE_DIR",
                                                  "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR")}, f)
    raise ImportError("torch_neuronx/_C.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")
'''


def fake_extension(folder: Path) -> Path:
    folder.mkdir()
    (folder / "broken_neuronx.py").write_text(BROKEN_EXTENSION)
    info = folder / "torch_neuronx-2.14.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-neuronx\nVersion: 2.14.3.0.100\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_neuronx = broken_neuronx:_autoload\n")
    return folder


def run(args, env_extra=None, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


@pytest.mark.slow
def test_a_mismatched_torch_neuronx_gets_a_message_not_a_traceback_and_saw_the_cache_folder(tmp_path):
    ext = fake_extension(tmp_path / "site")
    record = tmp_path / "seen.json"
    out = run(["app.py", "--models", "tiny", "--cache-dir", str(tmp_path / "root")],
              {"PYTHONPATH": str(ext), "RECORD_AUTOLOAD": str(record)})
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr
    assert "could not load its Neuron backend" in out.stderr and "undefined symbol" in out.stderr
    assert "torch-neuronx 2.14.3.0.100" in out.stderr and "pip install -r requirements-neuron.txt" in out.stderr
    # the NEFF cache variables were set before `import torch` autoloaded torch-neuronx
    seen = json.loads(record.read_text())
    assert seen == {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "root" / "compile-cache" / "neff"),
                    "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR": str(tmp_path / "root" / "neff-locks")}


@pytest.mark.slow
def test_doctor_runs_here_and_passes(tmp_path):
    out = run(["app.py", "--doctor", "--models", "tiny", "--cache-dir", str(tmp_path)])
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    statuses = [line.split()[0] for line in lines[1:-1] if line and not line.startswith(" ")]
    assert set(statuses) <= {"pass", "skipped"} and "pass" in statuses
    for name in ("python", "torch / torch-neuronx", "import torch", "neuron-ls", "cores visible", "chat on cpu",
                 "image on cpu", "NEFF cache folder", "NEFF cache reuse", "panel counters", "model files",
                 "free disk (cache root)"):
        assert any(f" {name}" in line for line in lines), name
    assert any(line.startswith("skipped neuron-ls") or line.startswith("pass    neuron-ls") for line in lines)
    assert lines[-1] == "everything needed is in place"


@pytest.mark.slow
def test_doctor_fails_when_a_needed_model_is_not_cached(tmp_path):
    out = run(["-m", "tools.doctor", "--models", "full", "--no-image", "--cache-dir", str(tmp_path)],
              {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")})
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"^fail    chat model files: Qwen/Qwen3-0.6B: missing .*config.json", out.stdout, re.M)
    assert "fix: hf download Qwen/Qwen3-0.6B" in out.stdout and "1 needed check(s) failed" in out.stdout


def test_doctor_version_families():
    real = doctor._version
    cases = {("2.13.0", "2.13.3.0.5"): "pass", ("2.13.0", "2.14.3.0.5"): "fail", ("2.13.0", "1.0"): "fail",
             ("2.13.0", None): "skipped"}
    for (torch_v, neuronx), status in cases.items():
        doctor._version = {"torch": torch_v, "torch-neuronx": neuronx}.get
        try:
            assert doctor.check_versions().status == status, (torch_v, neuronx)
        finally:
            doctor._version = real
    assert doctor.check_python("2.13.3.0.5").status == ("pass" if sys.version_info[:2] >= (3, 12) else "fail")


def test_doctor_reads_neuron_ls_json():
    sample = json.dumps([{"neuron_device": i, "nc_count": 8, "logical_neuroncore_config": 2,
                          "neuron_processes": [{"pid": 1}] if i == 0 else []} for i in range(16)])
    assert doctor.summarize_neuron_ls(sample) == "16 devices, 128 NeuronCores, LNC 2, 1 process(es) using them"


def requirement(path: Path, name: str) -> str:
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if re.match(rf"{re.escape(name)}\s*(==|>=|<|$)", line):
            return line
    raise AssertionError(f"{name} not in {path.name}")


def test_neuron_requirements_pin_the_torch_neuronx_family_of_the_tested_torch():
    torch_pin = requirement(ROOT / "requirements.txt", "torch").split("==")[1]  # 2.13.0
    family = ".".join(torch_pin.split(".")[:2])
    assert requirement(ROOT / "requirements-neuron.txt", "torch-neuronx") == f"torch-neuronx=={family}.3.0.*"
    assert requirement(ROOT / "requirements-neuron.txt", "torch") == f"torch=={torch_pin}"


def test_requires_python_admits_the_neuron_wheels_pythons():
    spec = re.search(r'^requires-python = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert spec == ">=3.10,<3.15"  # Neuron 2.33 wheels: 3.12-3.14; the app (and CI) also runs on 3.10+


@pytest.mark.parametrize("text, expected", [("", None), ("Failed to load the backend extension: torch_neuronx", "x")])
def test_backend_load_failure_only_claims_neuron_errors(text, expected):
    sys.path.insert(0, str(ROOT))
    try:
        import app
    finally:
        sys.path.pop(0)
    message = app.backend_load_failure(RuntimeError(text or "something else"))
    assert (message is None) == (expected is None)
