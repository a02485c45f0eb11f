"""First run from the command line: the doctor, a broken Neuron install, the compiler on PATH, the install pins."""

from __future__ import annotations

import io
import json
import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
from support import fake_neuron, fake_neuron_ls
from support.cache_env import COMPILE_CACHE_VARIABLES
from support.fake_neuronx_cc import write as fake_compiler

from neuron_backend import neuron_install
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


def fake_extension(folder: Path, source: str = BROKEN_EXTENSION) -> Path:
    folder.mkdir()
    (folder / "broken_neuronx.py").write_text(source)
    info = folder / "torch_neuronx-2.14.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-neuronx\nVersion: 2.14.3.0.100\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_neuronx = broken_neuronx:_autoload\n")
    return folder


# An installed "torch-neuronx" whose autoload records which neuronx-cc PATH finds at that moment, then
# fails the way it does on a host without the Neuron runtime.
NO_RUNTIME_EXTENSION = '''
import os, shutil
def _autoload():
    with open(os.environ["RECORD_AUTOLOAD"], "w") as f:
        f.write(shutil.which("neuronx-cc") or "")
    raise ImportError("libnrt.so.1: cannot open shared object file: No such file or directory")
'''


def run(args, env_extra=None, timeout=300):
    """``args`` run as a fresh start would: none of the compile-cache variables an in-process app set."""
    env = {k: v for k, v in os.environ.items() if k not in COMPILE_CACHE_VARIABLES}
    env = {**env, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
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
def test_the_app_runs_its_venvs_compiler_unactivated_and_names_a_missing_runtime(tmp_path):
    venv_bin = tmp_path / "venv" / "bin"
    own = fake_compiler(venv_bin)
    (venv_bin / "python").symlink_to(sys.executable)  # a venv's python is a link; started without activation
    other = fake_compiler(tmp_path / "other")  # another install's compiler, earlier on PATH
    ext = fake_extension(tmp_path / "site", NO_RUNTIME_EXTENSION)
    record = tmp_path / "seen.txt"
    # The link finds no pyvenv.cfg beside it, so it starts as the base Python: give it this run's packages
    # (the tests may run in a venv of their own, as CI's do).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RECORD_AUTOLOAD": str(record),
           "PYTHONPATH": os.pathsep.join([str(ext), *site.getsitepackages()]),
           "PATH": f"{other.parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([str(venv_bin / "python"), "app.py", "--models", "tiny", "--cache-dir", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 3, out.stderr
    assert record.read_text() == str(own)  # at `import torch` PATH finds the venv's compiler, not the other
    assert out.stderr.count(f"put {venv_bin} first on PATH") == 1
    assert "Traceback" not in out.stderr and "libnrt.so.1: cannot open shared object file" in out.stderr
    assert "aws-neuronx-runtime-lib" in out.stderr and "must be the family" not in out.stderr


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


def test_the_model_checks_look_at_the_revision_asked_for(tmp_path, demo_models, hf_cache):
    from support.model_folders import add_to_cache

    old_commit = "fedcba9876543210fedcba9876543210fedcba98"
    add_to_cache(hf_cache, "test-org/chat", demo_models.chat, commit=old_commit)
    add_to_cache(hf_cache, "test-org/chat", demo_models.chat, only=["config.json"])  # main: no weights

    def checked(model: str) -> doctor.Check:
        settings = parse_settings(["--models", "full", "--no-image", "--chat-model", model, "--cache-dir",
                                   str(tmp_path)], env={})
        return doctor.check_models(settings)[0]

    pinned = checked(f"test-org/chat@{old_commit}")
    assert pinned.status == "pass" and f"test-org/chat@{old_commit} needs" in pinned.detail
    main = checked("test-org/chat")
    assert main.status == "fail" and main.fix == "hf download test-org/chat"
    absent = checked("test-org/chat@v9")
    assert absent.status == "fail" and absent.detail.startswith("test-org/chat@v9: missing")
    assert absent.fix == "hf download test-org/chat --revision v9"


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
    for version, status in (((3, 11, 7), "fail"), ((3, 12, 3), "pass"), ((3, 14, 0), "pass"), ((3, 15, 0), "fail")):
        python = doctor.Interpreter(version, sys.executable, venv=False)
        check = doctor.check_python("2.13.3.0.5", python=python)
        assert check.status == status and check.detail.startswith(".".join(map(str, version))), (version, check)
    assert doctor.check_python(None, python=doctor.Interpreter((3, 11, 7), sys.executable, False)).status == "pass"


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
    assert requirement(ROOT / "requirements-neuron.txt", "torch-neuronx") == f"torch-neuronx=={family}.3.1.*"  # 2.34
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


def load_error(cause: str) -> RuntimeError:
    """What torch raises when the torch-neuronx autoload fails with ``cause``."""
    error = RuntimeError("Failed to load the backend extension: torch_neuronx. You can disable extension "
                         "auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.")
    error.__cause__ = ImportError(cause)
    return error


def test_backend_load_failure_names_a_missing_runtime_or_an_old_glibc_apart_from_a_mismatch():
    sys.path.insert(0, str(ROOT))
    try:
        import app
    finally:
        sys.path.pop(0)
    runtime = app.backend_load_failure(load_error("libnrt.so.1: cannot open shared object file: No such file or "
                                                  "directory"))
    assert "aws-neuronx-runtime-lib" in runtime and "driver and runtime packages" in runtime
    assert "must be the family" not in runtime and "libnrt.so.1" in runtime
    glibc = app.backend_load_failure(load_error("/lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.42' not found "
                                                "(required by /v/lib/python3.14/site-packages/torch_neuronx/_C.so)"))
    assert "GLIBC_2.42" in glibc and "Ubuntu 26.04's glibc" in glibc and "must be the family" not in glibc
    assert neuron_install.glibc_version() in glibc  # the host's own, beside the one needed
    mismatch = app.backend_load_failure(load_error("torch_neuronx/_C.so: undefined symbol: _ZN3c10"))
    assert "must be the family" in mismatch and "pip install -r requirements-neuron.txt" in mismatch
    assert app.backend_load_failure(ImportError("libfoo.so: cannot open shared object file")) is None


def test_the_import_torch_check_gives_the_runtimes_fix(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def failing(name, *args, **kwargs):
        if name == "torch":
            raise load_error("libnrt.so.1: cannot open shared object file: No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing)
    check, torch = doctor.check_import_torch()
    assert check.status == "fail" and torch is None and "aws-neuronx-runtime-lib" in check.fix


UBUNTU_2604 = {"ID": "ubuntu", "VERSION_ID": "26.04", "PRETTY_NAME": "Ubuntu 26.04 LTS"}
UBUNTU_2404 = {"ID": "ubuntu", "VERSION_ID": "24.04", "PRETTY_NAME": "Ubuntu 24.04.3 LTS"}


def test_doctor_checks_the_os_the_neuron_wheels_support():
    check = doctor.check_os(True, UBUNTU_2604, "glibc 2.43")
    assert check.status == "pass" and check.detail.startswith("Ubuntu 26.04 LTS, glibc 2.43: what the Neuron 2.33")
    assert "not compared with a minimum" in check.detail  # says what it does not check
    check = doctor.check_os(True, UBUNTU_2404, "glibc 2.39")
    assert check.status == "fail" and not check.needed and "support Ubuntu 26.04 only" in check.detail
    assert "Ubuntu 26.04" in check.fix and "`import torch` check shows" in check.line()
    assert doctor.check_os(False, UBUNTU_2404, "glibc 2.39").status == "pass"  # a CPU host
    assert doctor.check_os(True, {}, "glibc 2.39").detail.startswith("no /etc/os-release, glibc 2.39")


def test_doctor_checks_that_path_finds_the_venvs_own_compiler(tmp_path):
    venv_bin, other, empty = tmp_path / "venv" / "bin", fake_compiler(tmp_path / "other"), str(tmp_path / "empty")
    python = str(venv_bin / "python")
    # none anywhere: skipped on a CPU host, a needed failure on a Neuron one
    assert doctor.check_compiler(False, python, empty, venv=True).status == "skipped"
    check = doctor.check_compiler(True, python, empty, venv=True)
    assert check.status == "fail" and check.needed and "every compile would fail" in check.detail
    # another install's compiler and none in the venv: not the one that goes with this torch-neuronx
    check = doctor.check_compiler(True, python, str(other.parent), venv=True)
    assert check.status == "fail" and check.needed and f"PATH finds {other}, but this venv" in check.detail
    assert check.fix == doctor.INSTALL_FIX
    own = fake_compiler(venv_bin)
    # the venv not activated: the app puts its bin/ first, a shell does not
    for path in (str(other.parent), empty):
        check = doctor.check_compiler(True, python, path, venv=True)
        assert check.status == "fail" and not check.needed and str(own) in check.detail, path
        assert "`python app.py` puts" in check.detail and check.fix == f"source {venv_bin / 'activate'}"
    check = doctor.check_compiler(True, python, os.pathsep.join([str(venv_bin), str(other.parent)]), venv=True)
    assert check.status == "pass" and check.detail.startswith(f"{own} (this venv's own)")
    assert doctor.check_compiler(True, python, str(other.parent), venv=False).status == "pass"  # no venv


def test_no_core_visible_while_neuron_ls_lists_devices_fails_the_whole_doctor(neuron_ls, monkeypatch, tmp_path):
    neuron_ls("2.33", devices=16)
    fake_neuron.install(monkeypatch, cores=0)  # torch-neuronx loaded, no core visible to this process
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: {"torch": "2.13.0", "torch-neuronx": "2.13.3.0.5"}.get(
        dist, real(dist)))
    compiler = fake_compiler(tmp_path / "cc")
    monkeypatch.setenv("PATH", f"{compiler.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(doctor, "os_release", lambda: UBUNTU_2604)
    # a Python the Neuron wheels exist for, outside a venv: whatever runs the tests, only the cores fail
    monkeypatch.setattr(doctor, "this_python", lambda: doctor.Interpreter((3, 12, 3), sys.executable, venv=False))
    out = io.StringIO()
    status = doctor.run(parse_settings(["--models", "tiny", "--cache-dir", str(tmp_path / "root")], env={}), out)
    text = out.getvalue()
    assert re.search(r"^pass    python: 3.12.3 ", text, re.M), text
    assert re.search(r"^pass    torch / torch-neuronx: torch 2.13.0, torch-neuronx 2.13.3.0.5", text, re.M), text
    assert re.search(r"^pass    neuronx-cc: ", text, re.M), text
    assert re.search(r"^fail    cores visible: torch.neuron sees 0 NeuronCores, but neuron-ls lists 16", text, re.M)
    assert status == 1 and text.splitlines()[-1] == "1 needed check(s) failed", text
    assert "everything needed is in place" not in text


def test_neuron_requirements_pin_one_release_family_and_the_docs_make_the_venv_with_python3():
    neuron = ROOT / "requirements-neuron.txt"
    # 2.34's compiler and NKI versions are not readable: left to pip, as the Neuron docs' install command does
    assert requirement(neuron, "neuronx-cc") == "neuronx-cc==2.*"
    assert requirement(neuron, "nki") == "nki"
    assert "Ubuntu 26.04" in neuron.read_text() and "could not be read" in neuron.read_text()
    for page in ("README.md", "docs/trainium.md"):
        text = (ROOT / page).read_text()
        assert "python3 -m venv .venv" in text and not re.search(r"python3\.\d+ -m venv", text), page


def test_the_image_memory_check_is_the_load_check_made_before_loading(tmp_path, demo_models, hf_cache, monkeypatch):
    """The doctor says whether the image model fits its device by the estimate loading uses (weights, the decode
    at the largest size, the declared references' tokens), with the numbers and the flags to change."""
    from support.model_folders import add_to_cache

    from neuron_backend import devices
    from neuron_backend.image import loading

    add_to_cache(hf_cache, "test-org/image", demo_models.image)
    settings = parse_settings(["--models", "full", "--no-chat", "--image-model", "test-org/image", "--device", "cpu",
                               "--sizes", "64x64,96x64", "--references", "0,1,2", "--cache-dir", str(tmp_path)],
                              env={})
    placements = devices.resolve_placements(settings)
    monkeypatch.setattr(loading, "free_bytes", lambda kind, core, *_: 64 * 2**30)
    fits, = doctor.check_memory_fit(settings, placements)
    assert fits.status == "pass" and fits.name == "image memory (cpu)"
    assert "needs ~" in fits.detail and "reference tokens" in fits.detail and "64.0 GiB free on cpu" in fits.detail
    monkeypatch.setattr(loading, "free_bytes", lambda kind, core, *_: 2**20)
    short, = doctor.check_memory_fit(settings, placements)
    assert short.status == "fail" and short.needed
    assert "more than the 0.0 GiB free on cpu" in short.detail and "fewer --references" in short.detail
    elsewhere = parse_settings(["--models", "full", "--no-chat", "--image-model", "test-org/absent", "--device",
                                "cpu", "--cache-dir", str(tmp_path)], env={})
    absent, = doctor.check_memory_fit(elsewhere, devices.resolve_placements(elsewhere))
    assert absent.status == "skipped" and not absent.needed


def test_the_doctor_sets_each_engine_against_its_core_as_the_runtime_reports_it(tmp_path, monkeypatch,
                                                                                real_size_models):
    """On the fake runtime (23.8 GiB per core) with the real-size FLUX.2-klein-4B and Qwen3-0.6B folders: one line
    per engine with its estimate, what the core has free and the headroom kept; their sum when they share a core."""
    from neuron_backend import devices

    fake_neuron.install(monkeypatch)
    settings = parse_settings(["--models", "full", "--chat-model", str(real_size_models.chat), "--image-model",
                               str(real_size_models.image), "--cache-dir", str(tmp_path)], env={})
    placements = devices.resolve_placements(settings)
    chat, image = doctor.check_memory_fit(settings, placements)
    free = "23.8 GiB free on neuron, 2.0 GiB of it kept for the runtime"
    assert (chat.status, chat.name) == ("pass", "chat memory (neuron:0)")
    assert chat.detail.startswith("needs ~1.7 GiB in bfloat16 (0.60 B parameters: weights 1.1 GiB + KV cache of 1 x "
                                  "4096 tokens 0.4 GiB") and free in chat.detail
    assert (image.status, image.name) == ("pass", "image memory (neuron:1)")
    # the float32 decode and the edit slot's attention scores, were they materialised: loaded without the scores
    assert "needs ~27.8 GiB in bfloat16" in image.detail and free in image.detail
    assert "Loading anyway" in image.detail and "decoding 1024x1024 in bfloat16" in image.detail
    assert "needs ~20.5 GiB" in image.detail
    per_core = {c.name: c.detail for c in doctor.check_counters_and_memory(placements)}
    assert per_core["memory neuron:1"] == "0.00 GiB allocated of 23.8 GiB"
    fake_neuron.install(monkeypatch, cores=1)  # one core visible: both engines on neuron:0
    placements = devices.resolve_placements(settings)
    *_, both = doctor.check_memory_fit(settings, placements)
    assert both.name == "chat + image memory (neuron:0)" and both.status == "fail" and both.needed
    assert "~22.2 GiB together" in both.detail and "--chat-device / --image-device" in both.fix


def test_with_a_chat_server_the_doctor_looks_at_it_instead_of_a_core(warm_app):
    from support.app import app_settings, free_port

    _, url = warm_app
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--chat-server", url + "v1"])
    check = doctor.check_chat_server(settings)
    assert (check.status, check.detail) == (doctor.PASS, f"serves {settings.chat_model} (context 256 tokens)")
    gone = f"http://127.0.0.1:{free_port()}/v1"
    check = doctor.check_chat_server(settings.replace(options={"chat_server": gone}))
    assert check.status == doctor.FAIL and gone in check.detail and "--chat-server" in check.detail
    local_chat = [c.name for c in doctor.check_models(settings.replace(models="full"))]
    assert local_chat == ["image model files"]  # the chat's weights are the server's


def test_with_image_workers_the_doctor_looks_at_each_instead_of_a_core(warm_app):
    from support.app import SIZES, app_parts, app_settings, free_port

    from neuron_backend import devices

    _, url = warm_app
    gone = f"http://127.0.0.1:{free_port()}"
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--sizes", SIZES + ",128x128",
                             "--image-server", f"{url.rstrip('/')},{gone}"])
    placements = devices.resolve_placements(settings, None, app_parts(settings).elsewhere)
    up, down = doctor.check_placements(placements, settings)[1:]
    assert (up.status, up.name) == (doctor.PASS, f"image worker {url.rstrip('/')}")
    assert up.detail == "2/2 shapes ready (64x64, 96x64); it does not declare 128x128", up.detail
    assert down.status == doctor.FAIL and f"The image worker at {gone} cannot be reached (ConnectError" in down.detail
    local = [c.name for c in doctor.check_models(settings.replace(models="full"))]
    assert local == ["chat model files"]  # the image weights are the workers'


def test_a_234_json_keyed_otherwise_falls_back_to_plain_neuron_ls_and_never_fails_the_host(neuron_ls):
    neuron_ls("2.34-unread", devices=16)
    check, listed = doctor.check_neuron_ls()
    assert check.status == "pass", check.line()
    assert "plain `neuron-ls` answered" in check.detail and "its JSON could not be read" in check.detail
    assert "`neuron-ls --output-format json` printed no device list" in check.detail
    assert "`neuron-ls -j` exit 1" in check.detail  # 2.34 refuses -j
    assert listed == doctor.UNREAD_DEVICES and "--device-check" in check.fix
    assert "could not be read" in doctor._seen(listed)  # what a later check says of the devices


def test_the_driver_check_still_fails_when_plain_neuron_ls_fails_too(neuron_ls):
    neuron_ls("broken")
    check, _ = doctor.check_neuron_ls()
    assert check.status == "fail" and f"`neuron-ls` exit 1: {fake_neuron_ls.DRIVER_ERROR}" in check.detail
