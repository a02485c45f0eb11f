"""Text from a PNG is untrusted: its settings line is parsed in linear time, and is capped.

The old infotext pattern backtracked quadratically on a long run of key characters without a ':'
(a 32 KB line took 8.7 s, with the GIL held, so the whole server froze). The timing checks
run the parsers in a child process with a timeout, so a parser that regressed cannot hang the suite.
A dropped PNG's settings (paste-back, and its A1111 parser): tests/tools/test_paste_back.py.
"""

from __future__ import annotations

import random
import re
import time

import pytest
from support.png_text import HUGE, NESTED, SHAPES, child_timings, png_with

from neuron_backend.image.png_info import (
    MAX_SETTINGS_CHARS,
    infotext,
    parse_infotext,
    read_png_parameters,
    settings_pairs,
)

# The pattern the scanner replaces: its pairs are the reference on short lines.
OLD_PAIR = re.compile(r'\s*([\w][\w \-/()]*):\s*("(?:\\.|[^\\"])*"|[^,]*)(?:,|$)')


def test_the_scanner_finds_what_the_old_pattern_found():
    rng = random.Random(20240611)
    pieces = ["a", "B", "_", "1", "é", "٣", " ", "\t", "\n", "\u00a0", "-", "/", "(", ")", ":", ",", '"', "\\",
              "Steps", ": ", '", ', '\\"', "\\\\"]
    for _ in range(20_000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        assert settings_pairs(line) == OLD_PAIR.findall(line), repr(line)
    for line in ['Steps: 4, Sampler: "Euler, a", Prompt: "say \\"hi\\", then: go", Seed: 1',
                 'Steps: 4, Note: "unclosed, Seed: 2', 'Steps: 4,, ,Seed:3 ,Size :64x64, (x): "a"b, CFG scale: 1']:
        assert settings_pairs(line) == OLD_PAIR.findall(line)


def test_quoted_values_round_trip_as_before():
    params = {"prompt": "a fox", "steps": 4, "sampler": 'Euler "a", fast: yes', "seed": 42, "size": "64x64"}
    parsed = parse_infotext(infotext(params))
    assert (parsed["prompt"], parsed["Steps"], parsed["Sampler"], parsed["Seed"]) == (
        "a fox", "4", 'Euler "a", fast: yes', "42")


@pytest.mark.slow
def test_adversarial_settings_lines_parse_in_linear_time():
    """The scanner itself, uncapped: 4x the text costs about 4x the CPU time, not 16x, and 1 MB stays far
    under the 2.3 CPU s the quadratic pattern needed for 16 KB. CPU seconds of this process
    (process_time): the 1 MB shapes take 0.2-0.3 s here alone and up to 0.6 s late in the full suite."""
    def cpu_seconds(text: str) -> float:
        t0 = time.process_time()
        settings_pairs(text)
        return time.process_time() - t0

    for name, body in SHAPES.items():
        quarter, whole = cpu_seconds(body[: len(body) // 4]), cpu_seconds(body)
        assert whole < 2.0 and whole < 8 * max(quarter, 0.01), (name, quarter, whole)
    timings = child_timings("neuron_backend.image.png_info", "parse_infotext")
    assert len(timings) == 2 * len(SHAPES)
    slow = [row for row in timings if row[3] > 0.5]
    assert not slow, slow


def test_a_settings_line_over_the_cap_is_left_unparsed():
    head = "Steps: 4, Size: 64x64, Seed: 1, Note: "
    fits = head + "n" * (MAX_SETTINGS_CHARS - len(head))
    assert len(fits) == MAX_SETTINGS_CHARS
    assert parse_infotext("a fox\n" + fits)["Seed"] == "1"
    over = fits + "n"
    assert parse_infotext("a fox\n" + over) == {"prompt": "a fox\n" + over}


def test_png_parameters_survive_broken_json(tmp_path):
    # read_png_parameters falls back to the infotext when the JSON chunk does not read as an object
    infotext_only = "a fox\nSteps: 4, Seed: 1, Size: 64x64"
    for chunk in (NESTED, "[1, 2]", '{"seed": ' + HUGE + "}"):
        path = png_with(tmp_path / "broken.png", parameters=infotext_only, showcase=chunk)
        assert read_png_parameters(path) == {"prompt": "a fox", "Steps": "4", "Seed": "1", "Size": "64x64"}
    assert parse_infotext('a fox\nSteps: 4, Model: "bad \\q escape"')["Model"] == "bad \\q escape"
