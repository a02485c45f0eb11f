"""What the NEFF cache key depends on, recorded in a bundle's manifest and compared on install: a bundle
made for another instance family, LNC, compiler options, Python or install folders says which graphs
will not hit instead of "N of N usable"; temporary files never travel, the HLO and NKI caches do."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from neuron_backend import devices
from neuron_backend.compile_cache import configure_compile_cache
from neuron_backend.errors import CacheBundleError
from neuron_backend.settings import parse_settings
from tools.cache import bundle, manifest

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "/dev/root / ext4 rw 0 0\n"
HLO_CACHE_ENV, NKI_TRACE_ENV = "TORCH_NEURONX_HLO_CACHE_DIR", "NKI_TRACE_CACHE_URL"


def _described(kind: str = "neuron") -> dict:
    """A manifest as a Trainium host writes it, two engines on Neuron."""
    shapes = {"chat": ["prefill-32", "prefill-64"], "image": ["64x64"]}
    return {"format": manifest.FORMAT, "software": {"python": "3.12", "torch": "2.13.0"},
            "device": {"machine": "x86_64", "instance_family": "trn2", "logical_nc_config": "2",
                       "opt_level": None, "compiler_flags": None, "platform_target": None},
            "paths": {"torch": "/opt/venv/lib/python3.12/site-packages",
                      "transformers": "/opt/venv/lib/python3.12/site-packages",
                      "diffusers": "/opt/venv/lib/python3.12/site-packages", "app": "/srv/showcase"},
            "engines": {name: {"model": "demo", "kind": kind, "shapes": s} for name, s in shapes.items()}}


def test_the_manifest_records_what_the_neff_key_depends_on(tmp_path):
    product = tmp_path / "product_name"
    product.write_text("trn2.48xlarge\n")
    keys = manifest.device_keys({"NEURON_COMPILER_OPT_LEVEL": "1", "NEURON_CC_FLAGS": "--auto-cast=none"},
                                "neuron", product)
    assert keys["instance_family"] == "trn2" and keys["logical_nc_config"] == "2"  # trn2's default LNC
    assert keys["opt_level"] == "1" and keys["compiler_flags"] == "--auto-cast=none"
    assert manifest.device_keys({"NEURON_LOGICAL_NC_CONFIG": "1"}, "neuron", product)["logical_nc_config"] == "1"
    override = manifest.device_keys({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3"}, "neuron", product)
    assert override["instance_family"] == "trn3"
    assert manifest.device_keys({}, "neuron", tmp_path / "absent")["instance_family"] is None  # unknown
    cpu = manifest.device_keys({}, "cpu", product)
    assert cpu["instance_family"] == "cpu" and cpu["logical_nc_config"] is None
    for host in ("trn2n.48xlarge", "trn2u.48xlarge"):  # TorchNeuron compiles for trn2 on both
        product.write_text(f"{host}\n")
        keys = manifest.device_keys({}, "neuron", product)
        assert keys["instance_family"] == "trn2" and keys["logical_nc_config"] == "2", host

    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path)], env={})
    described = manifest.describe(settings, devices.resolve_placements(settings), {},
                                  {"chat": "demo", "image": "demo"}, env={})
    assert described["device"]["instance_family"] == "cpu"
    assert described["software"]["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    paths = described["paths"]
    assert paths["app"] == str(ROOT) and paths["torch"] == str(Path(torch.__file__).resolve().parents[1])
    assert paths["transformers"] and paths["diffusers"]


@pytest.mark.parametrize("field, theirs, ours", [
    ("device.instance_family", "trn2", "trn3"), ("device.logical_nc_config", "2", "1"),
    ("device.opt_level", None, "1"), ("device.compiler_flags", None, "--auto-cast=none"),
    ("paths.torch", "/opt/venv/lib/python3.12/site-packages", "/home/u/.venv/lib/python3.12/site-packages"),
    ("paths.app", "/srv/showcase", "/home/u/showcase")])
def test_a_neff_key_mismatch_is_said_per_field_and_no_graph_counts_as_usable(field, theirs, ours):
    bundle_side, here = _described(), _described()
    section, name = field.split(".")
    bundle_side[section][name], here[section][name] = theirs, ours
    usable, mismatches, total = manifest.compare(bundle_side, here)
    assert usable == {} and total == 3
    label = field if section == "paths" else name
    assert mismatches[0] == f"{label}: made for {theirs or 'none'}, this host has {ours or 'none'}"
    assert mismatches[1:] == [f"chat graphs prefill-32, prefill-64 will not hit here: the NEFF cache key "
                              f"differs in {label}", f"image graphs 64x64 will not hit here: the NEFF cache key "
                              f"differs in {label}"]


def test_the_neff_key_does_not_apply_to_graphs_off_neuron():
    bundle_side, here = _described("cpu"), _described("cpu")  # the NEFF key's fields: Neuron graphs only
    here["paths"]["app"] = "/home/u/showcase"
    usable, mismatches, _ = manifest.compare(bundle_side, here)
    assert usable == {"chat": ["prefill-32", "prefill-64"], "image": ["64x64"]} and mismatches == []
    usable, mismatches, _ = manifest.compare(_described(), copy.deepcopy(_described()))
    assert usable == {"chat": ["prefill-32", "prefill-64"], "image": ["64x64"]} and mismatches == []


def test_another_python_minor_makes_every_graph_unusable():
    here = _described()
    here["software"]["python"] = "3.13"
    usable, mismatches, _ = manifest.compare(_described(), here)
    assert usable == {} and mismatches == ["python 3.13 here, 3.12 in the bundle"]


def _archive(path: Path, described: dict) -> str:
    with tarfile.open(path, "w:gz") as tar:
        data = json.dumps(described | {"files": {}}).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_install_says_which_graphs_will_not_hit_instead_of_all_usable(tmp_path):
    here = _described()
    here["paths"]["app"] = "/home/u/showcase"
    source = _archive(tmp_path / "trn2-bundle.tar.gz", _described())
    with pytest.raises(CacheBundleError) as caught:
        bundle.install(source, here, tmp_path / "root", hashlib.sha256(Path(source).read_bytes()).hexdigest())
    said = str(caught.value)
    assert said.startswith("nothing installed from trn2-bundle.tar.gz: 0 of 3 graphs usable; paths.app: made for "
                           "/srv/showcase, this host has /home/u/showcase; chat graphs prefill-32, prefill-64 will "
                           "not hit here"), said
    assert not (tmp_path / "root" / "compile-cache").exists() or not any((tmp_path / "root" / "compile-cache").rglob(
        "*.neff"))


def test_temporary_files_never_enter_a_bundle_and_the_hlo_and_nki_caches_do(tmp_path):
    root, env = tmp_path / "root", {}
    configure_compile_cache(root, env, mounts=LOCAL)
    folder = root / "compile-cache"
    carried = {"neff/ab/cd/0123.neff": b"neff", "inductor/fxgraph/ab/entry": b"graph",
               Path(env[HLO_CACHE_ENV]).relative_to(folder).as_posix() + "/ab/key.hlo": b"hlo",
               Path(env[NKI_TRACE_ENV]).relative_to(folder).as_posix() + "/kernel.trace": b"nki"}
    temporary = ["neff/ab/cd/4567.neff.tmp", "neff/ab/cd/4567.neff.tmp.4242", "neff/ab/cd/.tmpk3j2x9",
                 "inductor/fxgraph/ab.tmp/entry", "hlo/.tmp-write/key.hlo"]
    for rel in [*carried, *temporary]:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(carried.get(rel, b"partial"))
    (folder / bundle.LIVE_MANIFEST).write_text(json.dumps(_described("cpu")))
    out = tmp_path / "bundle.tar.gz"
    described = bundle.export(root, out)
    assert sorted(described["files"]) == sorted(carried)
    with tarfile.open(out) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == sorted(
            ["manifest.json", *(f"files/{rel}" for rel in carried)])
