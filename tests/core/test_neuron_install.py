"""The Neuron install before ``import torch``: the venv's compiler first on PATH, what a failed load means."""

from __future__ import annotations

import logging
import os
import shutil

from support.fake_neuronx_cc import write as fake_compiler

from neuron_backend import neuron_install


def test_the_venvs_compiler_comes_first_on_path_when_the_venv_is_not_activated(tmp_path, monkeypatch, caplog):
    venv_bin = tmp_path / "venv" / "bin"
    own = fake_compiler(venv_bin)
    other = fake_compiler(tmp_path / "other" / "bin")  # another install's compiler, earlier on PATH
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("neuronx-cc") == str(other)
    with caplog.at_level(logging.INFO, logger="showcase.neuron_install"):
        assert neuron_install.interpreter_bin_first(executable=str(venv_bin / "python")) == str(venv_bin)
        assert neuron_install.interpreter_bin_first(executable=str(venv_bin / "python")) is None  # already first
    assert shutil.which("neuronx-cc") == str(own)
    assert os.environ["PATH"].split(os.pathsep)[:2] == [str(venv_bin), str(other.parent)]
    logged = [r.getMessage() for r in caplog.records if r.name == "showcase.neuron_install"]
    assert len(logged) == 1 and str(venv_bin) in logged[0] and "neuronx-cc" in logged[0]


def test_the_path_step_keeps_the_rest_of_path_and_works_on_a_given_environment(tmp_path):
    env = {"PATH": os.pathsep.join(["/usr/bin", str(tmp_path / "bin"), "/bin"])}
    assert neuron_install.interpreter_bin_first(env, str(tmp_path / "bin" / "python")) == str(tmp_path / "bin")
    assert env["PATH"].split(os.pathsep) == [str(tmp_path / "bin"), "/usr/bin", "/bin"]
    empty: dict = {}
    neuron_install.interpreter_bin_first(empty, str(tmp_path / "bin" / "python"))
    assert empty["PATH"] == str(tmp_path / "bin")


def test_os_release_is_read_field_by_field(tmp_path):
    path = tmp_path / "os-release"
    path.write_text('PRETTY_NAME="Ubuntu 26.04 LTS"\nNAME="Ubuntu"\nVERSION_ID="26.04"\nID=ubuntu\n# a comment\n')
    fields = neuron_install.os_release(path)
    assert (fields["ID"], fields["VERSION_ID"]) == neuron_install.WHEELS_OS
    assert fields["PRETTY_NAME"] == "Ubuntu 26.04 LTS"
    assert neuron_install.os_release(tmp_path / "missing") == {}
    assert neuron_install.glibc_version().split()[0] in ("glibc", "an")
