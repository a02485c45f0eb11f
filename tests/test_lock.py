"""The locks hold what the hand-written lists ask for, every import of the app and its tests is locked, and the
packages the tests run with are the locked ones (what CI installs, what a user installs today)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tools import lock

ROOT = Path(__file__).resolve().parents[1]
NEURON_ONLY = {"torch_neuronx", "torch_xla", "libneuronxla", "neuronxcc", "nki"}  # requirements-neuron.txt's
NOT_INSTALLED_HERE = {"locust"}  # bench/ and its clients name these themselves; they are no requirement


def top_level(path: Path) -> list[Requirement]:
    """The requirements a hand-written list asks for, following ``-r`` (``-c`` only constrains)."""
    found = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#") or line.startswith(("-c", "--")):
            continue
        if line.startswith("-r"):
            found += top_level(path.parent / line[2:].strip())
        else:
            found.append(Requirement(line))
    return found


def problems(source: Path, lock_text: str) -> list[str]:
    """What is wrong with a lock against its list: a requirement missing, a pin its specifier refuses, a line
    that is not one exact version."""
    pins = lock.pins(lock_text)
    found = []
    for requirement in top_level(source):
        name = lock.normalize(requirement.name)
        if name not in pins:
            found.append(f"{requirement.name} is not in the lock")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            found.append(f"{requirement.name}=={pins[name]} does not satisfy {requirement}")
    for line in lock_text.splitlines():
        if line and not line.startswith((" ", "#")) and not re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][^\s=<>~!*]*", line):
            found.append(f"not one exact version: {line}")
    return found


@pytest.mark.parametrize("source", list(lock.LOCKS))
def test_every_top_level_requirement_is_locked_at_a_version_it_allows(source):
    text = (ROOT / lock.LOCKS[source]).read_text()
    assert lock.COMMAND in text.split("\n\n")[0], "the lock's header names the command that makes it"
    assert not problems(ROOT / source, text)


def test_the_check_fails_on_a_missing_or_a_refused_pin(tmp_path):
    listed = tmp_path / "requirements.in"
    listed.write_text("openai==3.57.0  # a comment\nhttpx>=0.28\n-r more.in\n")
    (tmp_path / "more.in").write_text("numpy>=2\n")
    good = "httpx==0.29.0\n    # via -r requirements.in\nnumpy==2.1.0\nopenai==3.57.0\n"
    assert problems(listed, good) == []
    assert problems(listed, good.replace("numpy==2.1.0\n", "")) == ["numpy is not in the lock"]
    assert problems(listed, good.replace("0.29.0", "0.27.2")) == ["httpx==0.27.2 does not satisfy httpx>=0.28"]
    assert problems(listed, good + "gradio>=6\n") == ["not one exact version: gradio>=6"]


def test_the_dev_lock_agrees_with_the_apps_lock():
    app, dev = (lock.pins((ROOT / name).read_text()) for name in lock.LOCKS.values())
    assert app.keys() <= dev.keys(), "requirements-dev.txt lacks what the app's lock holds"
    assert {name: (app[name], dev[name]) for name in app if app[name] != dev[name]} == {}
    assert app["torch"] == "2.13.0"  # no local label: the CPU build's index and PyPI's CUDA build both match it


def test_every_package_the_tree_imports_is_locked():
    """Each third-party import of the app, its tools and its tests names a distribution the dev lock pins."""
    pins = lock.pins((ROOT / "requirements-dev.txt").read_text())
    distributions = metadata.packages_distributions()
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    local = {f.split("/")[0].removesuffix(".py") for f in listed} | {"support", "conftest"}
    local |= {Path(f).stem for f in listed if f.startswith("bench/")}  # bench modules tests import by path
    unlocked = {}
    for file in listed:
        if file.startswith("bench/") or not (ROOT / file).exists():
            continue
        for node in ast.walk(ast.parse((ROOT / file).read_text(), file)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local or top in NEURON_ONLY | NOT_INSTALLED_HERE:
                    continue
                owners = distributions.get(top, [])
                if not any(lock.normalize(owner) in pins for owner in owners):
                    unlocked.setdefault(top, file)
    assert unlocked == {}, f"imported but not locked (module: first file): {unlocked}"


def test_the_tests_run_with_the_locked_versions():
    """What this run imports is what the lock pins: a drifted install fails here, by name, not somewhere deep."""
    if any(True for _ in metadata.distributions(name="torch-neuronx")):
        pytest.skip("a Neuron install: requirements-neuron.lock, made on the host, is its lock")
    drifted = {}
    # python -m tools.lock --drift points this at the lock it resolved afresh and installed
    installed_from = Path(os.environ.get("SHOWCASE_INSTALLED_LOCK") or ROOT / "requirements-dev.txt")
    for name, pinned in lock.pins(installed_from.read_text()).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            drifted[name] = (pinned, None)
            continue
        if Version(installed).public != Version(pinned).public:  # torch's CPU build: 2.13.0+cpu is 2.13.0
            drifted[name] = (pinned, installed)
    assert drifted == {}, f"(locked, installed): install the lock with pip install -r requirements-dev.txt: {drifted}"


def test_the_neuron_list_takes_the_apps_top_level_list_and_says_how_its_lock_is_made():
    text = (ROOT / "requirements-neuron.txt").read_text()
    assert "-r requirements.in" in text and "-r requirements.txt" not in text
    assert "python -m tools.lock --neuron" in text and "pip install -r requirements-neuron.lock" in text
    assert lock.NEURON == {"requirements-neuron.txt": "requirements-neuron.lock"}


def test_the_drift_report_names_each_move():
    old = lock.pins("openai==3.57.0\nhttpx2==2.17.0\n    # via openai\nsix==1.16.0\n")
    new = lock.pins("openai==3.58.0\nhttpx2==2.17.0\nidna==3.10\n")
    lines = lock.moves(old, new)
    assert [line.split()[0] for line in lines] == ["idna", "openai", "six"]
    assert lines[1].split()[1:] == ["3.57.0", "->", "3.58.0"] and lines[2].endswith("(dropped)")


GROUPED = '''
import os, pathlib, pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("n", range(6))
def test_records_its_worker(n):
    pathlib.Path(os.environ["WORKERS_SEEN"], f"{n}").write_text(os.environ.get("PYTEST_XDIST_WORKER", "none"))
'''


@pytest.mark.slow
def test_the_locked_pytest_and_xdist_keep_a_group_on_one_worker(tmp_path):
    """CI's command (-n 2 --dist loadgroup) keeps each module's browser tests, which share one page, on one
    worker. pytest-xdist 3.8.0 groups by rewriting each item's node id, which pytest 9.2 no longer reads."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    seen = tmp_path / "seen"
    seen.mkdir()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                          "no:cacheprovider", "-o", "addopts=", str(tmp_path / "test_grouped.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "WORKERS_SEEN": str(seen)})
    assert out.returncode == 0, out.stdout + out.stderr
    workers = {path.read_text() for path in seen.iterdir()}
    assert len(list(seen.iterdir())) == 6 and len(workers) == 1, workers
