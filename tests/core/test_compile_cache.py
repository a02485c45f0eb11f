"""The process-wide compile-cache configuration: a preset NEFF cache is kept and said, the HLO and NKI
trace caches go under the cache root, and lock files stay on local disk when the root is on a network
filesystem (``/proc/mounts`` given as text)."""

from __future__ import annotations

import os
from pathlib import Path

from neuron_backend import compile_cache
from neuron_backend.compile_cache import configure_compile_cache
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings

LOCAL = "/dev/root / ext4 rw,relatime 0 0\n"
NEFF_CACHE_ENV, NEFF_LOCKS_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
HLO_CACHE_ENV, NKI_TRACE_ENV = "TORCH_NEURONX_HLO_CACHE_DIR", "NKI_TRACE_CACHE_URL"


def test_a_preset_neff_cache_is_kept_and_said(tmp_path):
    env = {NEFF_CACHE_ENV: "/data/my-neffs"}
    setup = configure_compile_cache(tmp_path / "root", env, mounts=LOCAL)
    assert env[NEFF_CACHE_ENV] == "/data/my-neffs"  # the user's choice, not <root>/compile-cache/neff
    assert setup.problem is None and len(setup.notes) == 1
    assert NEFF_CACHE_ENV in setup.notes[0] and "bundles neither carry nor fill it" in setup.notes[0]
    assert "/data/my-neffs" not in setup.notes[0]  # /status shows notes to anonymous visitors
    assert (NEFF_CACHE_ENV, "/data/my-neffs") in setup.paths  # the log names the folder
    # app.py configures, then Backend again: the preset value is still the user's, and still said
    again = configure_compile_cache(tmp_path / "root", env, mounts=LOCAL)
    assert env[NEFF_CACHE_ENV] == "/data/my-neffs" and again.notes == setup.notes


def test_the_apps_own_value_is_not_taken_for_a_preset_one(tmp_path):
    env: dict = {}
    configure_compile_cache(tmp_path / "first", env, mounts=LOCAL)
    setup = configure_compile_cache(tmp_path / "second", env, mounts=LOCAL)  # e.g. a child process, another root
    assert env[NEFF_CACHE_ENV] == str(tmp_path / "second" / "compile-cache" / "neff") and setup.notes == ()


def test_hlo_and_nki_trace_caches_go_under_the_root_unless_preset(tmp_path):
    env: dict = {}
    configure_compile_cache(tmp_path, env, mounts=LOCAL)
    assert env[HLO_CACHE_ENV] == str(tmp_path / "compile-cache" / "hlo")  # inside what a bundle carries
    assert env[NKI_TRACE_ENV] == str(tmp_path / "compile-cache" / "nki-trace")
    env = {HLO_CACHE_ENV: "/opt/hlo", NKI_TRACE_ENV: "/opt/nki"}
    setup = configure_compile_cache(tmp_path, env, mounts=LOCAL)
    assert env[HLO_CACHE_ENV] == "/opt/hlo" and env[NKI_TRACE_ENV] == "/opt/nki"
    assert env[NEFF_CACHE_ENV] == str(tmp_path / "compile-cache" / "neff")
    assert [n for n in (HLO_CACHE_ENV, NKI_TRACE_ENV) if any(n in note for note in setup.notes)] == [
        HLO_CACHE_ENV, NKI_TRACE_ENV]


def test_an_unwritable_root_keeps_a_preset_neff_cache(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = {NEFF_CACHE_ENV: "/data/my-neffs"}
    setup = configure_compile_cache(blocker, env, mounts=LOCAL)
    assert "not writable" in setup.problem and env[NEFF_CACHE_ENV] == "/data/my-neffs"
    assert Path(env[HLO_CACHE_ENV]).parent == setup.fallback == Path(env[NEFF_LOCKS_ENV]).parent


def test_lock_files_stay_on_local_disk_when_the_root_is_on_a_network_filesystem(tmp_path):
    efs, xdg = tmp_path / "efs", tmp_path / "xdg"
    for kind in ("nfs4", "lustre", "nfs"):
        mounts = LOCAL + f"fs-0123.efs.us-east-1.amazonaws.com:/ {efs} {kind} rw,vers=4.1 0 0\n"
        env = {"XDG_CACHE_HOME": str(xdg)}
        setup = configure_compile_cache(efs / "cache", env, mounts=mounts)
        assert env[NEFF_LOCKS_ENV] == str(xdg / "showcase" / "neff-locks"), kind  # local disk
        assert env[NEFF_CACHE_ENV] == str(efs / "cache" / "compile-cache" / "neff")  # the shared cache stays
        assert setup.problem is None and any(f"network filesystem ({kind})" in note for note in setup.notes)
        assert not (efs / "cache" / "neff-locks").exists()
    env = {"XDG_CACHE_HOME": str(xdg)}
    assert configure_compile_cache(tmp_path / "local", env, mounts=mounts).notes == ()
    assert env[NEFF_LOCKS_ENV] == str(tmp_path / "local" / "neff-locks")


def test_the_local_lock_folder_is_never_on_the_network_filesystem_either(tmp_path):
    home = tmp_path / "home"  # a home folder on NFS, as on many clusters
    mounts = LOCAL + f"nas:/home {home} nfs rw 0 0\nnas:/cache {tmp_path / 'nfs'} nfs rw 0 0\n"
    env = {"HOME": str(home)}
    configure_compile_cache(tmp_path / "nfs" / "root", env, mounts=mounts)
    assert not env[NEFF_LOCKS_ENV].startswith(str(home)) and compile_cache.on_network_filesystem(
        Path(env[NEFF_LOCKS_ENV]), mounts) is None


def test_the_mount_of_a_path_is_its_longest_mount_point():
    mounts = LOCAL + "nas:/x /mnt/shared\\040data nfs4 rw 0 0\nfsx@tcp:/fsx /mnt/fsx lustre rw 0 0\n"
    assert compile_cache.filesystem_type(Path("/mnt/shared data/cache"), mounts) == "nfs4"  # "\040": a space
    assert compile_cache.filesystem_type(Path("/mnt/fsx"), mounts) == "lustre"
    assert compile_cache.filesystem_type(Path("/mnt/fsxx"), mounts) == "ext4"  # not under /mnt/fsx
    assert compile_cache.on_network_filesystem(Path("/var/tmp"), mounts) is None


def test_status_says_a_preset_neff_cache_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv(NEFF_CACHE_ENV, str(tmp_path / "user-neffs"))
    for name in (HLO_CACHE_ENV, NKI_TRACE_ENV, "SHOWCASE_COMPILE_CACHE_SET"):
        monkeypatch.delenv(name, raising=False)
    backend = Backend(parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path / "root")],
                                     env={}))
    assert os.environ[NEFF_CACHE_ENV] == str(tmp_path / "user-neffs")
    notes = backend.status()["cache_notes"]
    assert len(notes) == 1 and NEFF_CACHE_ENV in notes[0] and str(tmp_path) not in notes[0]
