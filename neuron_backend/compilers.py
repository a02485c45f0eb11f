"""The ``neuronx-cc`` processes this process started: which run, for how long, making progress; ending them.

TorchNeuron runs ``neuronx-cc`` (a Python console script: ``python …/neuronx-cc …``) as a child process that
starts helpers of its own. Only descendants of this process whose program or script is named ``neuronx-cc``
are looked at or touched, with every process they started. Why: docs/trainium.md, "The first run".
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger("showcase.warmup")

COMPILER = "neuronx-cc"
PROGRESS_CPU_S = 0.01  # CPU seconds a compiler run must add between two looks to count as progress


@dataclass
class CompilerRun:
    """One ``neuronx-cc`` run seen during a compile task (times: epoch seconds)."""

    number: int  # 1 for the task's first run, 2 for the next, …
    started: float  # when the process was created
    cpu_s: float  # its CPU time (with its helpers') at the last look
    progressed: float  # when its CPU time last grew (or it was first seen)
    seen: float  # the last look that found it running
    ended: bool = False

    def state(self, now: float) -> dict:
        return {"run": self.number, "seconds": round(now - self.started, 1), "idle_s": round(now - self.progressed, 1)}


def _cpu_seconds(process) -> float | None:
    """CPU time of ``process``, its ended children's, and its live descendants' (None: it is gone)."""
    import psutil

    try:
        t = process.cpu_times()
        total = t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        helpers = process.children(recursive=True)
    except psutil.Error:
        return None
    for helper in helpers:
        try:
            c = helper.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


class CompileWatch:
    """The ``neuronx-cc`` runs below this process during one compile task, oldest first: which run is compiling,
    for how long, and whether it makes progress. Used from one thread (the warm-up's)."""

    def __init__(self) -> None:
        self._runs: dict[tuple[int, float], CompilerRun] = {}  # (pid, create time) -> the run

    def poll(self, now: float) -> list[CompilerRun]:
        """Look at the compilers running now (``now``: epoch seconds); return them, oldest first."""
        found = compilers()
        pids = {p.pid for p in found}
        running = []
        for process in found:
            try:
                if process.ppid() in pids:  # a compiler started by a compiler: part of that run
                    continue
                key = (process.pid, process.create_time())
            except Exception:  # noqa: BLE001 - gone since: not running
                continue
            cpu = _cpu_seconds(process)
            if cpu is None:
                continue
            run = self._runs.get(key)
            if run is None:
                run = self._runs[key] = CompilerRun(len(self._runs) + 1, min(key[1], now), cpu, now, now)
            elif cpu > run.cpu_s + PROGRESS_CPU_S:
                run.cpu_s, run.progressed = cpu, now
            run.seen = now
            running.append(run)
        for run in self._runs.values():
            run.ended = run.ended or run not in running
        return sorted(running, key=lambda r: r.number)

    def summary(self) -> list[dict]:
        """Each run seen, oldest first: wall seconds from its start to the last look that found it (so to the
        look interval, ``warmup.WATCH_EVERY_S``; a run shorter than one interval may go unseen) and its CPU seconds."""
        return [{"run": r.number, "seconds": round(r.seen - r.started, 1), "cpu_s": round(r.cpu_s, 1),
                 "ended": r.ended} for r in sorted(self._runs.values(), key=lambda r: r.number)]


def _named_compiler(process) -> bool:
    """Whether the process runs the compiler: as the program, or as the script an interpreter runs."""
    try:
        argv = process.cmdline()
    except Exception:  # noqa: BLE001 - gone or not ours to read: not a compiler we can stop
        return False
    return any(os.path.basename(arg) == COMPILER for arg in argv[:2])


def compilers(pid: int | None = None) -> list:
    """The ``neuronx-cc`` processes among the descendants of ``pid`` (default this process), as psutil processes."""
    import psutil

    try:
        children = psutil.Process(os.getpid() if pid is None else pid).children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in children if _named_compiler(p)]


def kill_compilers(pid: int | None = None, wait_s: float = 5.0) -> list[int]:
    """Kill every ``neuronx-cc`` below ``pid`` (default this process) and what each started; their pids."""
    import psutil

    found = compilers(pid)
    doomed = []
    for compiler in found:
        try:
            doomed += [compiler, *compiler.children(recursive=True)]
        except psutil.Error:
            doomed.append(compiler)
    for process in doomed:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(doomed, timeout=wait_s)
    if found:
        log.warning("killed %d %s process(es) past the compile time limit: %s", len(found), COMPILER,
                    ", ".join(str(p.pid) for p in found))
    return [p.pid for p in found]
