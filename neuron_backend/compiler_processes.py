"""The ``neuronx-cc`` processes this process started, found and killed when a compile runs past its limit.

TorchNeuron compiles each NEFF by running the ``neuronx-cc`` it finds on ``PATH`` as a child process
(a Python console script, so its command line reads ``python …/neuronx-cc …``), and that compiler
starts helpers of its own. A warm-up task past ``--compile-timeout-min`` cannot stop its Python thread,
but it can end the compiler: then the compile fails, the thread gets the error and ends, and the next
task does not wait behind it. Only descendants of this process whose program or script is named
``neuronx-cc`` are touched, with every process they started.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("showcase.warmup")

COMPILER = "neuronx-cc"


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
