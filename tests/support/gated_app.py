"""app.py with gates on the models' steps, so a browser test can hold a chat reply or an image mid-run.

A test that presses Stop must press it while the server is still working. On the tiny models a reply or
an image takes a few seconds, and on a loaded machine the page can see the first words or the first step
only after the server has sent the last, so the Stop lands on a finished run. The gates remove that race:
while the file ``$BROWSER_TEST_GATE/<gate>`` exists and holds N, the N-th and later steps after it
appeared wait until the test removes it or replaces it with a new hold (60 s at most). The ``chat``
gate counts one-token decode steps (prefill and the image text encoder pass freely); the ``image`` gate
counts the transformer's denoising steps; the ``size-<W>x<H>`` gate counts whole pipeline runs at that
size, warm-up's included (a test holds a size's warm-up so the page can ask for it while it is still
warming up). The app runs unchanged: only the model classes are wrapped before app.py runs as ``__main__``.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import time
from pathlib import Path

from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel
from transformers import Qwen3ForCausalLM

APP = Path(__file__).resolve().parents[2] / "app.py"
GATES = Path(os.environ["BROWSER_TEST_GATE"])
MAX_HOLD_S = 60.0
_counted: dict[str, tuple] = {}  # gate -> (the hold file seen last: inode, mtime), steps counted since


def _file_key(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _wait_at(gate: str) -> None:
    hold = GATES / gate
    key = _file_key(hold)
    try:
        after = int(hold.read_text())
    except (FileNotFoundError, ValueError):  # no gate, or the test is still writing it
        return
    seen, steps = _counted.get(gate, (None, 0))
    steps = steps + 1 if seen == key else 1
    _counted[gate] = (key, steps)
    if steps < after:
        return
    deadline = time.monotonic() + MAX_HOLD_S  # held until the file goes or is replaced (a new hold)
    while _file_key(hold) == key and time.monotonic() < deadline:
        time.sleep(0.01)


def _gated(cls, gate: str, counts=lambda args, kwargs: True) -> None:
    forward = cls.forward

    @functools.wraps(forward)  # generate() reads the signature (logits_to_keep) through __wrapped__
    def gated_forward(self, *args, **kwargs):
        if counts(args, kwargs):
            _wait_at(gate)
        return forward(self, *args, **kwargs)

    cls.forward = gated_forward


def _one_token(args, kwargs) -> bool:
    ids = kwargs.get("input_ids", args[0] if args else None)
    return ids is not None and ids.shape[-1] == 1


def _gated_sizes(cls) -> None:
    call = cls.__call__

    @functools.wraps(call)
    def gated_call(self, *args, **kwargs):
        _wait_at(f"size-{kwargs.get('width')}x{kwargs.get('height')}")
        return call(self, *args, **kwargs)

    cls.__call__ = gated_call


_gated(Qwen3ForCausalLM, "chat", _one_token)
_gated(Flux2Transformer2DModel, "image")
_gated_sizes(Flux2KleinPipeline)

if __name__ == "__main__":
    sys.argv = [str(APP), *sys.argv[1:]]
    sys.path[0] = str(APP.parent)  # as `python app.py` has it
    runpy.run_path(str(APP), run_name="__main__")
