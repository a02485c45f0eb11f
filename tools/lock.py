"""The locks and the drift check: ``python -m tools.lock`` remakes them, ``python -m tools.lock --drift`` tells
what a fresh install would get today and whether the fast loop passes with it.

The hand-written top-level lists are ``requirements.in`` (the app) and ``requirements-dev.in`` (tests and CI,
held to the app's lock by ``-c requirements.txt``). pip-tools' ``pip-compile`` resolves each into a lock,
``requirements.txt`` and ``requirements-dev.txt``: every package, transitive ones included, at one exact version.
It resolves with pip itself, so it reads the same indexes, find-links and constraints as ``pip install`` on the
machine that makes the lock (the CPU build of torch included).

torch is written as ``torch==2.13.0``, without the CPU build's local label (``+cpu``): the lock is resolved with
the CPU build, and ``==2.13.0`` matches it, while a machine that reaches only PyPI can still install the CUDA
build of the same release first. Everything else is as pip-compile writes it. ``--neuron`` makes a Trainium
host's own lock, ``requirements-neuron.lock``, from ``requirements-neuron.txt`` (its index cannot be reached
where the CPU locks are made).

``--drift`` resolves the ``.in`` files afresh (no lock as a seed) into a temporary folder, prints every package
whose version would move, installs the fresh dev lock into a new venv there and runs the README's fast loop
with it, then ``tests/test_lock.py`` whole (its slow check that pytest-xdist still groups CI's browser tests).
Its exit status is 0 when both pass (2 when the resolve or the install fails). To bump the locks after a green
drift check: ``python -m tools.lock --upgrade``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = {"requirements.in": "requirements.txt", "requirements-dev.in": "requirements-dev.txt"}  # in this order
NEURON = {"requirements-neuron.txt": "requirements-neuron.lock"}  # made on a Trainium host (--neuron)
COMMAND = "python -m tools.lock"
PIP_COMPILE = ["--quiet", "--strip-extras", "--allow-unsafe", "--no-emit-find-links", "--no-emit-trusted-host",
               "--newline", "lf"]
FAST_LOOP = ["-m", "pytest", "-q", "-m", "not slow and not browser", "-n", "2", "-p", "no:cacheprovider"]
TOOLCHAIN = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_lock.py"]
LOCAL_LABEL = re.compile(r"^(torch==[0-9.]+)\+[A-Za-z0-9.]+$", re.M)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", re.M)


def pins(lock_text: str) -> dict[str, str]:
    """Package name (normalised, PEP 503) -> the version a lock pins."""
    return {normalize(name): version for name, version in PIN.findall(lock_text)}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def compile_locks(folder: Path, upgrade: bool = False, neuron: bool = False) -> None:
    """Resolve each top-level list in ``folder`` into its lock beside it (an existing lock seeds the resolve
    unless ``upgrade``). The CPU locks name no index (pip's own configuration finds torch's CPU build); the Neuron
    lock keeps its list's Neuron and PyTorch indexes, without which pip cannot find torch-neuronx."""
    for source, lock in (NEURON if neuron else LOCKS).items():
        emit = [] if neuron else ["--no-emit-index-url"]
        args = [sys.executable, "-m", "piptools", "compile", *PIP_COMPILE, *emit, "--output-file", lock, source]
        command = f"{COMMAND} --neuron" if neuron else COMMAND
        env = {**os.environ, "CUSTOM_COMPILE_COMMAND": command}  # the command the lock's header names
        subprocess.run(args + (["--upgrade"] if upgrade else []), cwd=folder, env=env, check=True)
        path = folder / lock
        path.write_text(LOCAL_LABEL.sub(r"\1", path.read_text()))


def moves(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """One line per package whose pin differs: moved, added or dropped."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name), new.get(name)
        if before != after:
            lines.append(f"{name:<32} {before or '(not locked)':>16} -> {after or '(dropped)'}")
    return lines


def drift(keep: bool = False) -> int:
    work = Path(tempfile.mkdtemp(prefix="drift-"))
    try:
        for source in LOCKS:
            shutil.copy(ROOT / source, work / source)
        print(f"== resolving {', '.join(LOCKS)} afresh in {work}", flush=True)
        try:
            compile_locks(work)
        except subprocess.CalledProcessError as exc:
            print(f"the fresh resolve failed ({exc}): a top-level requirement cannot be met today", flush=True)
            return 2
        for lock in LOCKS.values():
            changed = moves(pins((ROOT / lock).read_text()), pins((work / lock).read_text()))
            print(f"== {lock}: {len(changed)} package(s) would move", flush=True)
            for line in changed:
                print("   " + line, flush=True)
        venv = work / "venv"
        python = venv / "bin" / "python"
        print(f"== installing the fresh requirements-dev.txt into {venv}", flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, "-r", str(work / "requirements-dev.txt")], check=True)
            subprocess.run([str(python), "-m", "pip", "check"], check=True)
        except subprocess.CalledProcessError as exc:
            print(f"the fresh install failed ({exc})", flush=True)
            return 2
        print("== the fast loop with it: python " + " ".join(FAST_LOOP), flush=True)
        started = time.monotonic()
        env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               "VIRTUAL_ENV": str(venv), "SHOWCASE_INSTALLED_LOCK": str(work / "requirements-dev.txt")}
        status = subprocess.run([str(python), *FAST_LOOP], cwd=ROOT, env=env).returncode
        verdict = "passes" if status == 0 else f"FAILS (exit {status})"
        print(f"== the fast loop {verdict} on today's packages ({time.monotonic() - started:.0f} s)", flush=True)
        # The toolchain's own checks, slow ones included (the test runner grouping CI's browser tests).
        print("== python " + " ".join(TOOLCHAIN), flush=True)
        toolchain = subprocess.run([str(python), *TOOLCHAIN], cwd=ROOT, env=env).returncode
        print(f"== the toolchain checks {'pass' if toolchain == 0 else f'FAIL (exit {toolchain})'}", flush=True)
        return status or toolchain
    finally:
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--upgrade", action="store_true", help="remake the locks from the .in files afresh "
                        "(every package at its newest allowed version), not seeded by today's locks")
    parser.add_argument("--drift", action="store_true", help="resolve afresh in a temporary folder, print what "
                        "would move, run the fast loop in a new venv with it; the locks are left as they are")
    parser.add_argument("--keep", action="store_true", help="with --drift: keep the temporary folder and venv")
    parser.add_argument("--neuron", action="store_true", help="on a Trainium host: make requirements-neuron.lock "
                        "from requirements-neuron.txt (the Neuron pip repository must be reachable)")
    args = parser.parse_args(argv)
    if args.drift:
        return drift(args.keep)
    compile_locks(ROOT, upgrade=args.upgrade, neuron=args.neuron)
    return 0


if __name__ == "__main__":
    sys.exit(main())
