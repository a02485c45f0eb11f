"""Device placement with torch.neuron faked (the only runtime we cannot run here)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from support.app import app_parts, app_settings

from neuron_backend import devices
from neuron_backend.errors import ConfigError, DeviceUnavailableError
from neuron_backend.settings import parse_settings


def settings(*argv):
    return parse_settings(["--models", "tiny", *argv], env={})


@pytest.fixture
def fake_neuron(monkeypatch):
    """A stand-in for the torch.neuron module torch-neuronx registers: 2 visible cores."""
    fake = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2, synchronize=lambda: None)
    monkeypatch.setattr(torch, "neuron", fake, raising=False)
    return fake


@pytest.fixture
def no_neuron(monkeypatch):
    monkeypatch.delattr(torch, "neuron", raising=False)
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import raises ModuleNotFoundError


def test_neuron_detected_with_cores(fake_neuron):
    host = devices.detect()
    assert host.neuron_cores == 2 and host.neuron_problem is None


def test_auto_on_neuron_places_engines_on_separate_cores(fake_neuron):
    placements = devices.resolve_placements(settings())
    chat, image = placements["chat"], placements["image"]
    assert (chat.device, image.device) == ("neuron:0", "neuron:1")
    for p in (chat, image):
        assert p.kind == "neuron" and p.compile_backend == "neuron" and p.compile  # compile auto -> on
        assert p.inputs_on_cpu and p.input_device == "cpu" and p.dtype == torch.bfloat16
        assert p.device != "auto"


def test_per_engine_override_and_bad_core(fake_neuron):
    placements = devices.resolve_placements(settings("--device", "neuron", "--image-device", "neuron:0"))
    assert placements["image"].device == "neuron:0" and placements["chat"].device == "neuron:0"
    with pytest.raises(DeviceUnavailableError, match=r"--chat-device: neuron:5 does not exist \(2 visible\)"):
        devices.resolve_placements(settings("--chat-device", "neuron:5"))


def test_explicit_cpu_on_neuron_host(fake_neuron):
    p = devices.resolve_placements(settings("--device", "cpu", "--no-image"))["chat"]
    assert p.kind == "cpu" and not p.compile and p.compile_backend == "inductor" and not p.inputs_on_cpu


def test_neuron_refused_without_neuron(no_neuron):
    with pytest.raises(DeviceUnavailableError) as info:
        devices.resolve_placements(settings("--device", "neuron"))
    message = str(info.value)
    assert message.startswith("--device: no neuron device") and "AWS Neuron pip repository" in message
    assert "allowed: auto, cpu" in message
    assert isinstance(info.value, ConfigError)


def test_placeholder_torch_neuronx_is_reported_not_raised(monkeypatch):
    monkeypatch.delattr(torch, "neuron", raising=False)
    class Finder:  # makes `import torch_neuronx` raise like the PyPI placeholder does
        def find_spec(self, name, path=None, target=None):
            if name == "torch_neuronx":
                raise ImportError("WRONG PACKAGE. Please install the package from Neuron Repository")

    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    host = devices.detect()
    assert host.neuron_cores == 0 and "WRONG PACKAGE" in host.neuron_problem
    with pytest.raises(DeviceUnavailableError, match="WRONG PACKAGE"):
        devices.resolve_placements(settings("--device", "neuron"))


def test_auto_on_cpu_host(no_neuron):
    p = devices.resolve_placements(settings())["chat"]
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    assert p.kind == "cpu" and p.device == "cpu" and p.dtype == torch.float32 and not p.compile


def test_compile_on_for_cpu_uses_inductor(no_neuron):
    p = devices.resolve_placements(settings("--device", "cpu", "--compile", "on"))["image"]
    assert p.compile and p.compile_backend == "inductor"


def test_describe_is_plain_data(fake_neuron):
    placements = devices.resolve_placements(settings())
    info = devices.describe(placements)
    assert "Trainium" in info["accelerator"] and info["engines"]["image"]["device"] == "neuron:1"
    assert info["versions"]["torch"] == torch.__version__
    import json

    json.dumps(info)


def test_compile_cache_is_configured_under_root(tmp_path, monkeypatch):
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"):
        monkeypatch.setenv(name, "unset")
    monkeypatch.delenv("TORCH_NEURONX_NEFF_CACHE_DIR", raising=False)  # one the user set is kept (test_compile_cache)
    setup = devices.configure_compile_cache(tmp_path)
    assert setup.problem is None and setup.folder == tmp_path / "compile-cache"
    assert os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] == str(tmp_path / "compile-cache" / "neff")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile-cache" / "inductor")
    assert os.environ["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"] == str(tmp_path / "neff-locks")  # the compile locks


def test_unwritable_compile_cache_goes_to_a_temporary_folder_not_disabled(tmp_path, monkeypatch):
    for name in ("TORCH_NEURONX_NEFF_DISABLE_CACHE", "TORCH_NEURONX_DISABLE_NEFF_CACHE", "TORCHINDUCTOR_CACHE_DIR",
                 "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    setup = devices.configure_compile_cache(blocker)
    assert setup.folder is None and "not writable" in setup.problem and str(setup.fallback) in setup.problem
    # disabling the NEFF cache would also drop the in-process cache: every eager op would recompile
    assert "TORCH_NEURONX_NEFF_DISABLE_CACHE" not in os.environ and "TORCH_NEURONX_DISABLE_NEFF_CACHE" not in os.environ
    for name in ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert Path(os.environ[name]).parent == setup.fallback
    (Path(os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"])).mkdir(parents=True)  # writable
    assert devices.configure_compile_cache(blocker).fallback == setup.fallback  # app.py, then Backend: one folder


@pytest.mark.slow
def test_backend_does_not_import_gradio():
    code = (
        "import sys, neuron_backend, neuron_backend.settings, neuron_backend.devices, neuron_backend.shapes;"
        "import pkgutil, importlib;"
        "[importlib.import_module('neuron_backend.' + m.name) for m in pkgutil.iter_modules(neuron_backend.__path__)];"
        "print('gradio' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


ARENA_PROBE = """
import ctypes, ctypes.util, json, sys, threading
import torch
from neuron_backend import devices
from neuron_backend.devices import Placement
if sys.argv[1] == "limit":
    cpu = devices.resolve_placements(__import__("neuron_backend.settings", fromlist=["x"]).parse_settings(
        ["--models", "tiny", "--device", "cpu"], env={}))
    print("NOTE", devices.limit_malloc_arenas(cpu))
def work():
    for _ in range(20):
        torch.ones(64, 1024).sum()  # small allocations: served by the thread's arena, not mmap
        bytearray(200_000)
threads = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
fp = libc.fopen(sys.argv[2].encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp)); libc.fclose(ctypes.c_void_p(fp))
print("HEAPS", open(sys.argv[2]).read().count("<heap nr="))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc arenas")
@pytest.mark.parametrize("mode", ["default", "limit"])
def test_cpu_runs_share_one_malloc_arena(tmp_path, mode):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", ARENA_PROBE, mode, str(tmp_path / "info.xml")], env=env,
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    heaps = int(out.stdout.split("HEAPS ")[1])
    if mode == "limit":
        assert "NOTE malloc arenas: 1" in out.stdout and heaps == 1
    else:
        assert heaps > 1  # without the limit, the four threads got arenas of their own


def test_malloc_arena_limit_respects_the_environment_and_skips_neuron(fake_neuron, monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    placements = devices.resolve_placements(settings("--device", "cpu"))
    assert devices.limit_malloc_arenas(placements) == "malloc arenas: MALLOC_ARENA_MAX=4 (from the environment)"
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert devices.limit_malloc_arenas(devices.resolve_placements(settings())) is None  # both on neuron cores


@pytest.mark.parametrize("sharded, whole", [("chat", "image"), ("image", "chat")])
def test_under_tp_on_neuron_the_whole_engine_shares_this_rank_core(sharded, whole):
    # each rank's process sees only its own NeuronCore (TorchNeuron: NEURON_RT_VISIBLE_CORES=LOCAL_RANK)
    s = app_settings(["--models", "tiny", "--tp", "2", "--tp-engine", sharded],
                     env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    placements = devices.resolve_placements(s, devices.HostDevices(4, 0), sharding=app_parts(s).sharding)
    assert placements[sharded].device == "neuron:0" and placements[sharded].tp == 2  # this rank's core
    assert placements[whole].device == "neuron:0" and placements[whole].tp == 1 and placements[whole].core == 0
    with pytest.raises(ConfigError, match=rf"--{whole}-device: under torchrun each rank's process sees only its own"):
        other = app_settings(["--models", "tiny", "--tp", "2", "--tp-engine", sharded, f"--{whole}-device",
                              "neuron:2"], env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
        devices.resolve_placements(other, devices.HostDevices(4, 0), sharding=app_parts(other).sharding)


def test_under_tp_on_cuda_the_whole_engine_defaults_to_a_device_outside_the_group():
    s = app_settings(["--models", "tiny", "--tp", "2", "--device", "cuda"],
                     env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    placements = devices.resolve_placements(s, devices.HostDevices(0, 4), sharding=app_parts(s).sharding)
    assert placements["chat"].device == "cuda:1" and placements["image"].device == "cuda:2"


def test_core_report_says_whether_visible_cores_are_limited():
    assert "NEURON_RT_VISIBLE_CORES=0-1" in devices.core_report(devices.HostDevices(2, 0, visible_cores="0-1"))
    unset = devices.core_report(devices.HostDevices(64, 0))
    assert unset.startswith("64 NeuronCore(s)") and "reserves every core on the host" in unset
