"""Untrusted PNG text for the tests of the settings-line scanner (tests/core/test_png_text.py) and of paste-back
(tests/tools/test_paste_back.py): settings lines that made the old infotext pattern slow, hostile JSON, an 8x8 PNG
carrying given text chunks, and parsers timed in a child process (one that regressed cannot hang the suite)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

ROOT = Path(__file__).resolve().parents[2]
MB = 2**20

# Settings lines that made the old pattern (or a naive replacement) slow: runs with no ':' after
# them, openings that never close, escapes.
SHAPES = {
    "word characters": "a" * MB,
    "spaces": " " * MB,
    "parentheses": "(" * MB,
    "key characters": "a b-c/(d)" * (MB // 9),
    "unclosed quote": 'Seed: "' + "a" * MB,
    "unclosed quote of escapes": 'Seed: "' + '\\"' * (MB // 2),
    "unclosed quotes, many keys": 'a: "x, ' * (MB // 7),
    "backslashes": "\\" * MB,
}

TIMER = """
import json, sys, time
from {module} import {parser}
parse = {parser}
shapes = json.loads(sys.stdin.read())
for cap in (16_000, None):  # just under the cap first, then the whole 1 MB line
    for name, body in shapes.items():
        line = "Steps: 4, " + body[:cap]
        t0 = time.process_time()
        try:
            parse("a fox\\n" + line)
        except Exception:  # a refusal is an answer too
            pass
        print(json.dumps([parse.__name__, name, len(line), time.process_time() - t0]), flush=True)
"""

NESTED = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError
HUGE = "5" * 5000  # int() raises ValueError("Exceeds the limit (4300 digits) ...")


def child_timings(module: str, parser: str) -> list[list]:
    """[parser, shape, length, CPU seconds] of ``module.parser`` on each shape, capped then whole, in a child
    process that has 30 s."""
    try:
        out = subprocess.run([sys.executable, "-c", TIMER.format(module=module, parser=parser)],
                             input=json.dumps(SHAPES), capture_output=True, text=True, timeout=30, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"parsing took over 30 s; timings so far: {exc.stdout}")
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(row) for row in out.stdout.splitlines()]


def png_with(path: Path, **texts: str) -> Path:
    """An 8x8 PNG carrying ``texts`` as text chunks (keyword -> text; zTXt for the JSON one, as ours are)."""
    info = PngInfo()
    for keyword, text in texts.items():
        info.add_text(keyword, text, zip=keyword == "showcase")
    Image.new("RGB", (8, 8)).save(path, pnginfo=info)
    return path
