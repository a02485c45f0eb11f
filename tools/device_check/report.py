"""The first-device check's report: host facts, two warm-up phases, a bundle between them, parity, the doctor.

``python -m tools.doctor --device-check --out report.json [app flags]`` (or ``python -m
tools.device_check``). In order:

1. ``neuron-ls`` (its JSON form, else plain) and the installed versions, read without ``import torch``;
2. the cold phase (``phase.py``, a fresh process on a fresh cache root): one chat bucket, one
   image size and its edit slot with one reference (one edit, a 1024x1024 reference at the full preset)
   warmed up from nothing, timed; greedy tokens and one image compared with CPU; memory
   per core;
3. that cache exported as a bundle and installed, in a second fresh process, into another fresh
   cache root (at another path, same venv and app folder), which warms up the same shapes: its
   persistent-cache hits and misses say what the bundle brought;
4. the saved-forwards variant (``--chat-aot on --image-aot on``), twice on a third fresh root: whether
   the ``neuron`` backend's compiled forwards save, and whether a second process loads them;
5. the doctor's checks, last, in a process of its own: its placement checks hold the NeuronCores
   until its process exits, and the phases need them before.

Each phase has a time limit (``--phase-timeout-min``); past it its whole process group is killed
(``neuronx-cc`` included) and the report says so. The report is written after every step, so a run
stopped part-way leaves what it had. Every field is described in docs/trainium.md.

Why a fresh cache root and not a copy of the venv: the NEFF cache key includes the absolute source
locations of the traced program (the install folders of torch, transformers, diffusers and the
app), so a venv copied to another path misses every NEFF by construction (the bundle manifest
names that mismatch on install); copying a Neuron venv also means gigabytes. ``--bundle-python
PATH`` runs the warm phase with another interpreter (a venv copy you made) to see that case.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from neuron_backend.compile_cache import (
    HLO_CACHE_ENV,
    INDUCTOR_CACHE_ENV,
    NEFF_CACHE_ENV,
    NEFF_LOCKS_ENV,
    NKI_TRACE_ENV,
    SET_BY_APP_ENV,
)
from neuron_backend.errors import ShowcaseError
from neuron_backend.settings import parse_settings
from tools import neuron_ls
from tools.parallel.plugin import choice as tensor_parallel

FORMAT = 1
ROOT = Path(__file__).resolve().parents[2]  # the app's folder: the phases run from it
VERSIONS = ("torch", "torch-neuronx", "neuronx-cc", "transformers", "diffusers")
CACHE_VARIABLES = (NEFF_CACHE_ENV, NEFF_LOCKS_ENV, HLO_CACHE_ENV, NKI_TRACE_ENV, INDUCTOR_CACHE_ENV, SET_BY_APP_ENV)
NEURON_LS_TIMEOUT_S = 30
DOCTOR_TIMEOUT_S = 1800  # its probes have 600 s each (a cold neuronx-cc included)
KILL_GRACE_S = 10
FRESH_ROOT = ("a fresh cache root at another path, same venv and app folder: the NEFF cache key includes the "
              "absolute source locations of the traced program (the install folders of torch, transformers, "
              "diffusers and the app), so a venv copied to another path would miss every NEFF by construction; "
              "--bundle-python runs this phase with a venv copy you made")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The check's own flags and the app flags left over (passed to both phases and the doctor)."""
    p = argparse.ArgumentParser(prog="python -m tools.doctor --device-check", description=__doc__.splitlines()[0],
                                epilog="Every other flag is the app's (python app.py --help), e.g. --models full.")
    p.add_argument("--device-check", action="store_true", help=argparse.SUPPRESS)  # the doctor's switch
    p.add_argument("--out", type=Path, required=True, help="the JSON report to write")
    p.add_argument("--phase-timeout-min", type=float, default=240.0,
                   help="minutes each warm-up phase may take before its processes are killed (default 240)")
    p.add_argument("--bundle-python", default=sys.executable,
                   help="the interpreter of the warm phase (default this one); a venv copied elsewhere tests that case")
    p.add_argument("--keep", action="store_true", help="keep the work folder (both cache roots, the bundle, logs)")
    return p.parse_known_args(argv)


def versions() -> dict:
    """Python and the installed distributions the report names (None: not installed); never imports them."""
    found: dict = {"python": platform.python_version()}
    for dist in VERSIONS:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def phase_flags(settings, app_flags: list[str], root: Path) -> list[str]:
    """The app flags of a phase: the user's, narrowed to one bucket and one size with its one-reference edit slot
    (a 1024x1024 reference at the full preset's first size), batch 1, its own cache root."""
    return [*app_flags, "--models", settings.models, "--chat-buckets", str(settings.buckets[0]),
            "--sizes", settings.sizes[0].label, "--references", "0,1", "--chat-batch", "1", "--cache-dir", str(root)]


def child_env() -> dict:
    """This environment without the compile-cache variables: each phase points them at its own cache root."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env


def run_phase(role: str, flags: list[str], work: Path, python: str, timeout_s: float,
              name: str | None = None) -> dict:
    """Run one phase in a new process group; kill the whole group (compilers included) past ``timeout_s``.
    ``name``: of its result and log files (default the role)."""
    result, log = work / f"{name or role}.json", work / f"{name or role}.log"
    command = [python, "-m", "tools.device_check.phase", "--role", role, "--result", str(result), "--", *flags]
    started = time.perf_counter()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            kill_group(proc)
    seconds = round(time.perf_counter() - started, 3)
    tail = log.read_text(errors="replace")[-4000:]
    if code is None:
        return {"error": f"the {role} phase ran past {timeout_s / 60:.3g} min (--phase-timeout-min); its "
                         "processes were killed", "process_s": seconds, "log_tail": tail}
    if code != 0 or not result.is_file():
        return {"error": f"the {role} phase exited {code}", "process_s": seconds, "log_tail": tail}
    out = json.loads(result.read_text())
    out["process_s"] = seconds
    return out


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group of ``proc`` (it leads its own session), then SIGKILL what is left; return once
    no process of the group runs. A killed process stays in the process table, running, until the kernel has
    ended it, and a compiler whose parent died is no longer ``proc``'s descendant: so the wait is on the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + KILL_GRACE_S
        while (running := _group_runs(proc)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not running:
            break


def _group_runs(proc: subprocess.Popen) -> bool:
    """Whether a process of ``proc``'s group still runs. The leader is reaped here; a zombie has ended (only
    its parent's reaping is left, which a container's init may never do)."""
    import psutil

    if proc.poll() is None:
        return True
    for other in psutil.process_iter(["status"]):
        try:
            if os.getpgid(other.pid) == proc.pid and other.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):  # gone meanwhile
            continue
    return False


def export_bundle(cold_root: Path, out: Path) -> dict:
    """Pack the cold phase's compile cache as a bundle; its sha256, size and contents."""
    from tools.cache import bundle

    described = bundle.export(cold_root, out)
    return {"path": str(out), "sha256": bundle.archive_sha256(out), "bytes": out.stat().st_size,
            "files": len(described["files"]),
            "shapes": {name: e.get("shapes", []) for name, e in described["engines"].items()}}


def doctor_results(app_flags: list[str], work: Path, timeout_s: float = DOCTOR_TIMEOUT_S) -> dict:
    """The doctor's checks as data and its exit status, from a process of its own (after the phases: its
    placement checks hold the cores until it exits)."""
    out = work / "doctor.json"
    command = [sys.executable, "-m", "tools.doctor", "--report-json", str(out), *app_flags]
    env = {**os.environ, "PYTHONPATH": child_env()["PYTHONPATH"]}
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"the doctor gave no answer in {timeout_s:.0f} s"}
    if not out.is_file():
        return {"error": f"the doctor exited {done.returncode} without its checks", "log_tail":
                (done.stdout + done.stderr)[-4000:]}
    return json.loads(out.read_text())


def skipped(report: dict) -> list[dict]:
    """Every part of the report that did not run or could not run, with its reason, in one list."""
    out = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            if "skipped" in value and isinstance(value["skipped"], str):
                out.append({"part": where, "reason": value["skipped"]})
            if "error" in value and isinstance(value["error"], str):
                out.append({"part": where, "reason": value["error"]})
            if "note" in value and isinstance(value["note"], str):
                out.append({"part": where, "reason": value["note"]})
            for key, inner in value.items():
                if key not in ("skipped", "error", "note", "tried", "checks"):
                    walk(inner, f"{where}.{key}" if where else key)

    walk({k: v for k, v in report.items() if k != "skipped"}, "")
    for check in report.get("doctor", {}).get("checks", []):
        if check["status"] == "skipped":
            out.append({"part": f"doctor.{check['name']}", "reason": check["detail"]})
    return out


def write(out: Path, report: dict, begun: float) -> None:
    """Write the report as it stands (atomically), with the wall time so far."""
    report["wall_s"] = round(time.perf_counter() - begun, 3)
    report["skipped"] = skipped(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(out)


def memory(cold: dict) -> dict:
    """Memory per core after the cold phase's warm-up and parity (moved out of the phase's result)."""
    if "error" in cold:
        return {"skipped": "the cold phase did not finish"}
    mem = cold.pop("memory", None)
    return mem if mem else {"skipped": "no accelerator placement: nothing to read per core"}


def cache_counts(phase: dict) -> dict:
    """The persistent-cache hits and misses after a phase's warm-up, and what counted them."""
    counts = dict(phase.get("persistent_cache") or {})
    if counts and not counts.get("graphs_compiled") and not counts.get("hits") and not counts.get("misses"):
        counts["note"] = ("nothing was compiled in this phase (compile is off on this device, and eager ops compile "
                          "only on Neuron): no persistent-cache counter moved")
    return counts


def main(argv: list[str] | None = None) -> int:
    """Run the check and write the report; exit 0 when every phase ran (findings are in the report), else 1."""
    args, app_flags = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        from .phase import PLUGINS

        settings = parse_settings(app_flags, plugins=PLUGINS)
        tp = tensor_parallel(settings).tp  # checked as the app checks it
    except ShowcaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if tp > 1 or settings.options.get("cache_bundle"):
        print("error: --device-check runs one process per phase on its own cache roots: drop --tp and "
              "--cache-bundle (the check makes and installs its own bundle)", file=sys.stderr)
        return 2
    begun = time.perf_counter()
    work = settings.cache_dir / "device-check" / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    work.mkdir(parents=True)
    preset = sorted(k for k in CACHE_VARIABLES[:4] if os.environ.get(k))
    report: dict = {
        "format": FORMAT, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m tools.doctor", *(["--device-check"] if not args.device_check else []),
                             *(sys.argv[1:] if argv is None else argv)]),
        "host": {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "versions": versions(), "neuron_ls": neuron_ls.output(NEURON_LS_TIMEOUT_S),
        "settings": {"models": settings.models, "device": settings.device, "dtype": settings.dtype,
                     "compile": settings.compile, "chat_bucket": settings.buckets[0],
                     "context_length": settings.context_length, "image_size": settings.sizes[0].label,
                     "steps": settings.default_steps, "phase_timeout_min": args.phase_timeout_min,
                     "unset_for_the_phases": preset},
    }
    write(args.out, report, begun)
    timeout_s = args.phase_timeout_min * 60
    try:
        cold = run_phase("cold", phase_flags(settings, app_flags, work / "cold-root"), work, sys.executable, timeout_s)
        report["cold"] = cold
        if "persistent_cache" in cold:
            cold["persistent_cache"] = cache_counts(cold)
        report["warm_up"] = {"chat": cold.get("chat_warm_up"), "image": cold.get("image_warm_up"),
                             "image_edit": cold.get("image_edit_warm_up")} \
            if "error" not in cold else {"skipped": "the cold phase did not finish"}
        report["memory"] = memory(cold)
        report["core_memory"] = cold.pop("core_memory", None) or {"skipped": "the cold phase did not finish"}
        report["parity"] = cold.pop("parity", None) or {"skipped": "the cold phase did not finish"}
        write(args.out, report, begun)
        if "error" in cold:
            report["bundle"] = {"skipped": "the cold phase did not finish: there is no cache to bundle"}
        else:
            report["bundle"] = bundle_round_trip(settings, app_flags, work, args, timeout_s)
        write(args.out, report, begun)
        report["saved_forwards"] = saved_forwards_phases(settings, app_flags, work, timeout_s)
        write(args.out, report, begun)
        report["doctor"] = doctor_results(app_flags, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        report["work_folder"] = str(work) if args.keep else None
        write(args.out, report, begun)
    failed = [part for part in ("cold", "bundle") if "error" in report.get(part, {})]
    print(f"device check: report written to {args.out} in {report['wall_s']:.0f} s"
          + (f"; {', '.join(failed)} failed (see the report)" if failed else ""))
    return 1 if failed else 0


def saved_forwards_phases(settings, app_flags: list[str], work: Path, timeout_s: float) -> dict:
    """The saved-forwards variant (``--chat-aot on --image-aot on``), twice on one fresh root: what the first
    process saved (or why not), and what the second loaded."""
    flags = [*phase_flags(settings, app_flags, work / "aot-root"), "--chat-aot", "on", "--image-aot", "on"]
    out: dict = {"flags": "--chat-aot on --image-aot on"}
    for name in ("save", "load"):
        phase = run_phase("aot", flags, work, sys.executable, timeout_s, name=f"aot-{name}")
        out[name] = phase if "error" in phase else {
            "saved_forwards": phase["saved_forwards"], "process_s": phase["process_s"],
            "warm_up": {"chat": phase.get("chat_warm_up"), "image": phase.get("image_warm_up")}}
        if "error" in phase:
            break
    return out


def bundle_round_trip(settings, app_flags: list[str], work: Path, args, timeout_s: float) -> dict:
    """Export the cold cache, install it in the warm phase's fresh root, and what the warm-up then hit."""
    try:
        made = export_bundle(work / "cold-root", work / "bundle.tar.gz")
    except ShowcaseError as exc:
        return {"error": f"export failed: {exc}"}
    flags = phase_flags(settings, app_flags, work / "warm-root")
    flags += ["--cache-bundle", made["path"], "--cache-bundle-sha256", made["sha256"]]
    warm = run_phase("warm", flags, work, args.bundle_python, timeout_s)
    out = {"mode": FRESH_ROOT if args.bundle_python == sys.executable else
           f"the warm phase ran with {args.bundle_python} (another interpreter: a venv copy at another path)",
           "python": args.bundle_python, "export": made, "warm": warm}
    if "error" not in warm:
        out["install"] = warm.pop("bundle_install", None)
        out["persistent_cache_after_warm_up"] = cache_counts(warm)
        warm.pop("persistent_cache", None)
        out["warm_up"] = {"chat": warm.get("chat_warm_up"), "image": warm.get("image_warm_up")}
        warm.pop("memory", None)
        warm.pop("core_memory", None)
    return out
