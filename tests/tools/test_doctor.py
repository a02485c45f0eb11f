"""First run from the command line: the doctor, a broken torch-neuronx, the install pins."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import fake_neuron, fake_neuron_ls

from neuron_backend.settings import parse_settings
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


@pytest.mark.parametrize("form, command", [("2.34", "neuron-ls --output-format json"), ("2.33", "neuron-ls -j")])
def test_the_driver_check_passes_with_the_neuron_ls_of_either_release(neuron_ls, form, command):
    neuron_ls(form, devices=16, processes=1)
    check, listed = doctor.check_neuron_ls()
    assert check.status == "pass", check.line()
    assert "16 devices, 128 NeuronCores, LNC 2, 1 process(es) using them" in check.detail
    assert check.detail.endswith(f"(`{command}`)") and listed == 16


def test_the_driver_check_fails_clearly_when_neuron_ls_answers_neither_form(neuron_ls):
    neuron_ls("broken")
    check, listed = doctor.check_neuron_ls()
    assert check.status == "fail" and check.needed and listed == 0
    # what was run, each with its exit status and stderr; then what to do about each kind of error
    assert f"`neuron-ls --output-format json` exit 1: {fake_neuron_ls.DRIVER_ERROR}" in check.detail
    assert f"`neuron-ls -j` exit 1: {fake_neuron_ls.DRIVER_ERROR}" in check.detail
    assert "Neuron driver" in check.fix and "unknown flag" in check.fix


def test_doctor_reads_the_234_json_by_its_shape():
    sample = json.dumps({"instance": {"instance_type": "trn2.48xlarge", "logical_neuroncore_config": 2},
                         "ultraserver": None, "devices": [{"nc_count": 8, "neuron_processes": []}] * 16})
    assert doctor.summarize_neuron_ls(sample) == ("trn2.48xlarge: 16 devices, 128 NeuronCores, LNC 2, "
                                                  "0 process(es) using them")
    assert doctor.read_neuron_ls('{"instance": {"instance_type": "trn2.3xlarge"}}') is None
    assert doctor.read_neuron_ls("+--------+ NEURON DEVICE") is None


def test_no_torch_neuronx_or_no_core_while_neuron_ls_lists_devices_fails_with_the_fix(monkeypatch):
    from neuron_backend import devices

    monkeypatch.setattr(doctor, "_version", {"torch": "2.13.0", "torch-neuronx": None}.get)
    assert doctor.check_versions().status == "skipped"  # a CPU host: nothing listed
    check = doctor.check_versions(neuron_devices=1)
    assert check.status == "fail" and check.needed and check.fix == doctor.INSTALL_FIX
    assert "neuron-ls lists 1 Neuron device(s): the app would run on CPU" in check.detail

    fake_neuron.install(monkeypatch, cores=0)  # torch-neuronx loaded, no core visible to this process
    host = devices.detect()
    assert doctor.check_cores(host).status == "skipped"
    check = doctor.check_cores(host, neuron_devices=1)
    assert check.status == "fail" and check.needed and "NEURON_RT_VISIBLE_CORES" in check.fix
    assert check.detail.startswith("torch.neuron sees 0 NeuronCores, but neuron-ls lists 1 Neuron device(s)")


def test_doctor_on_neuron_234_tools_without_torch_neuronx_fails_with_the_fix(neuron_ls, monkeypatch, tmp_path):
    neuron_ls("2.34")
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: None if dist == "torch-neuronx" else real(dist))
    out = io.StringIO()
    status = doctor.run(parse_settings(["--models", "tiny", "--cache-dir", str(tmp_path)], env={}), out)
    text = out.getvalue()
    assert re.search(r"^pass    neuron-ls: trn2.3xlarge: 1 devices, 8 NeuronCores, LNC 2, 0 process\(es\) using "
                     r"them \(`neuron-ls --output-format json`\)$", text, re.M), text
    assert re.search(r"^fail    torch / torch-neuronx: .*torch-neuronx not installed, but neuron-ls lists 1 Neuron "
                     r"device\(s\)", text, re.M), text
    assert re.search(r"^fail    cores visible: no NeuronCores \(torch.neuron not registered\), but", text, re.M)
    assert f"fix: {doctor.INSTALL_FIX}" in text
    assert status == 1 and text.splitlines()[-1].endswith("needed check(s) failed")
    assert "everything needed is in place" not in text


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
