"""QA bench on the tiny demo models through a real Backend (CPU): plan, run, stop, re-run, export, compare."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from neuron_backend.chat.text import ChatRequest
from neuron_backend.errors import InvalidRequestError, UnsupportedSizeError
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from tools.demo_models import plugin as demo_builder
from tools.qa import grid as qa_grid
from tools.qa import runs as qa
from tools.qa.compare import compare_runs, compare_table
from tools.qa.html_report import export_html
from tools.qa.report import export_jsonl, import_jsonl, read_run

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = "\n".join(["Say hello.", "Name a colour.", "<script>alert('x')</script> & more", "Count to three.",
                     "What is a NeuronCore?"])
CHAT_VARIANTS = "cold: temperature=0.3, max_new_tokens=8\nhot: temperature=1.5, max_new_tokens=8"
BOTH_VARIANTS = ("small: size=64x64, steps=1, max_new_tokens=4, greedy=true\n"
                 "wide: size=96x64, steps=2, max_new_tokens=4, seed=7")


class StopAfter(threading.Event):
    """A stop event that reads as set from its n-th check on (deterministic mid-cell stops)."""

    def __init__(self, checks: int):
        super().__init__()
        self.checks, self.seen = checks, 0

    def is_set(self) -> bool:
        self.seen += 1
        return self.seen >= self.checks or super().is_set()


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa-cache")
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(root),
                               "--sizes", "64x64,96x64"], env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()  # warm-up, synchronously
    assert backend.status()["ready"]
    return backend


@pytest.fixture(scope="module")
def chat_result(backend):
    """5 prompts x 2 variants, run to the end once for the module; and the progress calls."""
    run = qa.plan_run(backend.settings, PROMPTS, variants=CHAT_VARIANTS, kind="chat", run_seed=11)
    seen = []
    qa.run_set(backend, run, progress=lambda done, total, eta: seen.append((done, total, eta)))
    return run, seen


@pytest.fixture
def chat_run(chat_result):
    return chat_result[0]


@pytest.fixture(scope="module")
def both_run(backend):
    """2 prompts x 2 variants x (chat, image), run once for the module."""
    run = qa.plan_run(backend.settings, "a red fox\na <b>bold</b> lighthouse", variants=BOTH_VARIANTS, kind="both")
    qa.run_set(backend, run)
    return run


def fresh(run: qa.QARun) -> qa.QARun:
    return copy.deepcopy(run)


# ----- planning and running -------------------------------------------------------------------------
@pytest.mark.slow
def test_five_prompts_two_variants_give_ten_cells_with_settings(chat_result):
    run, seen = chat_result
    assert len(run.cells) == 10 and [c.status for c in run.cells] == ["done"] * 10
    assert [(c.prompt_index, c.variant) for c in run.cells[:4]] == [(0, "cold"), (0, "hot"), (1, "cold"), (1, "hot")]
    for cell in run.cells:
        s = cell.settings
        assert s["temperature"] == (0.3 if cell.variant == "cold" else 1.5) and s["max_new_tokens"] == 8
        assert (s["top_p"], s["top_k"], s["thinking"], s["greedy"]) == (0.8, 20, False, False)  # defaults filled in
        assert s["seed"] == qa.derive_seed(11, cell.prompt_index)  # same seed for both variants of a prompt
        assert cell.stats["seed"] == s["seed"] and 1 <= cell.stats["new_tokens"] <= 8 and cell.text is not None
        assert cell.seconds > 0 and cell.error is None
    assert len({c.settings["seed"] for c in run.cells}) == 5
    assert any(cold.text != hot.text for cold, hot in zip(run.cells[::2], run.cells[1::2], strict=True))
    assert [d for d, _, _ in seen] == list(range(11)) and {t for _, t, _ in seen} == {10}
    assert seen[0][2] is None and seen[-1][2] == 0 and all(e is not None for _, _, e in seen[1:])
    assert run.meta["models"]["chat"].startswith("demo Qwen3") and run.meta["device"].startswith("CPU")
    headers, rows = qa_grid.results_table(run)
    assert headers == ["#", "prompt", "cold", "hot"] and len(rows) == 5
    assert "seed" in rows[0][2] and "tok/s" in rows[0][2]


def test_rerunning_a_chat_cell_reproduces_it(backend, chat_run):
    run = fresh(chat_run)
    qa.set_mark(run, 3, "fail", "too long")
    before = copy.deepcopy(run.cells[3])
    after = qa.rerun_cell(backend, run, 3)
    assert run.cells[3] is after and after.status == "done"
    assert (after.text, after.reasoning, after.settings) == (before.text, before.reasoning, before.settings)
    assert (after.mark, after.comment) == ("fail", "too long")  # the review survives a re-run


def test_both_kinds_and_rerun_gives_identical_image_bytes(backend, both_run):
    run = fresh(both_run)
    assert [(c.variant, c.kind) for c in run.cells[:4]] == [("small", "chat"), ("small", "image"),
                                                          ("wide", "chat"), ("wide", "image")]
    assert all(c.status == "done" for c in run.cells)
    image_cells = [i for i, c in enumerate(run.cells) if c.kind == "image"]
    sizes = {run.cells[i].variant: qa_grid.cell_image(run.cells[i]).size for i in image_cells}
    assert sizes == {"small": (64, 64), "wide": (96, 64)}
    wide = next(i for i in image_cells if run.cells[i].variant == "wide")
    assert run.cells[wide].settings == {"size": "96x64", "steps": 2, "guidance": None, "seed": 7}
    assert run.cells[wide].stats["seed"] == 7 and run.cells[wide].stats["steps_done"] == 2
    assert run.cells[0].settings["greedy"] is True and "greedy" in qa_grid.results_table(run)[1][0][2]
    before = run.cells[wide].image_png
    assert qa.rerun_cell(backend, run, wide).image_png == before  # same seed and settings: same bytes


@pytest.mark.slow
def test_stop_after_three_cells_keeps_them_and_a_second_run_resumes(backend, chat_run):
    run = qa.new_run_like(chat_run)
    stop = threading.Event()

    def progress(done, total, eta):
        if done == 3:
            stop.set()

    qa.run_set(backend, run, progress, stop)
    assert [c.status for c in run.cells] == ["done"] * 3 + ["pending"] * 7
    assert [c.text for c in run.cells[:3]] == [c.text for c in chat_run.cells[:3]]
    qa.run_set(backend, run)  # resumes with the cells not run
    assert [c.text for c in run.cells] == [c.text for c in chat_run.cells]


def test_stop_interrupts_the_running_image_cell(backend):
    run = qa.plan_run(backend.settings, "a slow one\nnever reached", variants="v: steps=3", kind="image")
    # check 1: before the first cell; check 2: after its first denoising step -> stop
    qa.run_set(backend, run, stop=StopAfter(2))
    assert [c.status for c in run.cells] == ["stopped", "pending"]
    assert run.cells[0].stats["stopped"] is True and run.cells[0].stats["steps_done"] == 1
    qa.run_set(backend, run)  # a stopped cell is run again from the start
    assert [c.status for c in run.cells] == ["done", "done"] and run.cells[0].stats["steps_done"] == 3


@pytest.mark.slow
def test_stop_interrupts_a_streaming_chat_cell(backend):
    run = qa.plan_run(backend.settings, "tell a long story", variants="long: max_new_tokens=64, greedy=true")
    full = qa.rerun_cell(backend, copy.deepcopy(run), 0)
    assert full.status == "done" and full.stats["new_tokens"] == 64
    # check 1: before the cell; check 2: at the first streamed update -> the stream is closed
    qa.run_set(backend, run, stop=StopAfter(2))
    cell = run.cells[0]
    assert cell.status == "stopped" and cell.stats is None and full.text.startswith(cell.text)
    assert len(cell.text) < len(full.text)
    assert not [t for t in threading.enumerate() if t.name == "chat-generate"]  # the generation ended
    assert qa.rerun_cell(backend, run, 0).text == full.text  # and the engine is free again


def test_a_failing_cell_records_its_error_and_the_run_goes_on(backend, chat_run):
    run = qa.new_run_like(chat_run)
    run.cells[1].settings["top_k"] = -5  # as if a hand-edited import: the engine refuses it
    qa.run_set(backend, run)
    assert run.cells[1].status == "failed" and "top_k" in run.cells[1].error
    assert all(c.status == "done" for i, c in enumerate(run.cells) if i != 1)
    assert "failed" in qa_grid.results_table(run)[1][0][3]


@pytest.mark.slow
def test_interactive_requests_run_between_cells(backend, chat_run):
    """A chat request from another tab, sent while a set runs, is served before the set ends."""
    run = qa.new_run_like(chat_run)
    finished_at, threads = [], []

    def interactive():
        final = list(backend.stream_chat(ChatRequest("an interactive user", max_new_tokens=4, greedy=True)))[-1]
        assert final.done
        finished_at.append(progress_done[-1])

    progress_done = [0]

    def progress(done, total, eta):
        progress_done.append(done)
        if done == 1:
            threads.append(threading.Thread(target=interactive))
            threads[0].start()

    qa.run_set(backend, run, progress)
    threads[0].join(timeout=30)
    # Served during the pause after the first cell (without the pause it waited ~5 cells: Lock is not fair).
    assert finished_at and finished_at[0] <= 2, finished_at


# ----- review, export, import, compare ------------------------------------------------------------------
def test_marks_and_their_errors(chat_run):
    run = fresh(chat_run)
    qa.set_mark(run, 0, "PASS", "fine")
    qa.set_mark(run, 0, "fail")  # comment None keeps it
    assert (run.cells[0].mark, run.cells[0].comment) == ("fail", "fine")
    qa.set_mark(run, 0, "", "")
    assert (run.cells[0].mark, run.cells[0].comment) == (None, "")
    with pytest.raises(InvalidRequestError, match="pass, fail or nothing"):
        qa.set_mark(run, 0, "maybe")
    with pytest.raises(InvalidRequestError, match="cells 0 to 9"):
        qa.set_mark(run, 10, "pass")
    with pytest.raises(InvalidRequestError, match="at most 2000"):
        qa.set_mark(run, 0, "pass", "x" * 2001)
    with pytest.raises(InvalidRequestError, match="The comment contains .* lone surrogate"):
        qa.set_mark(run, 0, "pass", "bad \ud800")  # it could not be exported as UTF-8
    assert qa_grid.grid_cell(run, 1, 3) == 3
    assert qa_grid.grid_cell(run, 0, 1) is None and qa_grid.grid_cell(run, 5, 2) is None


def marked(run: qa.QARun) -> qa.QARun:
    run = fresh(run)
    for i in range(len(run.cells)):
        qa.set_mark(run, i, ("pass", "fail", None)[i % 3], f"note {i} <script>bad()</script>" if i % 2 else "")
    return run


def test_html_report_carries_every_cell_and_mark_escaped(chat_run, both_run):
    for run in (marked(chat_run), marked(both_run)):
        page = export_html(run)
        assert "<script" not in page.lower()  # hostile prompts and comments are escaped, and no script of ours
        assert "&lt;script&gt;" in page
        for i, cell in enumerate(run.cells):
            assert f'id="cell-{i}" data-mark="{cell.mark or ""}"' in page
            assert f"seed {cell.settings['seed']}" in page
            if cell.comment:
                assert f"note {i} &lt;script&gt;bad()&lt;/script&gt;" in page
            if cell.image_png:
                assert f'src="data:image/png;base64,{cell.image_png}"' in page
        assert page.count('class="cell') == len(run.cells)


def test_html_thumbnails_large_images(both_run):
    page = export_html(both_run, thumbnail_px=32)
    assert page.count("data:image/jpeg;base64,") == 4 and "data:image/png" not in page


def test_jsonl_carries_everything_and_round_trips(chat_run, both_run, tmp_path):
    for run in (marked(chat_run), marked(both_run)):
        text = export_jsonl(run)
        lines = [json.loads(line) for line in text.splitlines()]
        assert len(lines) == 1 + len(run.cells) and lines[0]["type"] == "run"
        for i, (line, cell) in enumerate(zip(lines[1:], run.cells, strict=True)):
            assert line["index"] == i and line["mark"] == cell.mark and line["comment"] == cell.comment
            assert line["settings"] == cell.settings and line["prompt"] == run.rows[cell.prompt_index].prompt
        again = import_jsonl(text)
        assert again == run and export_jsonl(again) == text
        (tmp_path / "run.jsonl").write_text(text, encoding="utf-8")
        assert read_run(tmp_path / "run.jsonl") == run


def test_import_refuses_tampered_files(chat_run, both_run, tmp_path):
    text = export_jsonl(chat_run)
    with pytest.raises(InvalidRequestError, match="not a QA run export"):
        import_jsonl('{"prompt": "hi"}\n')
    with pytest.raises(InvalidRequestError, match="line 3 is not valid JSON"):
        import_jsonl("\n".join(text.splitlines()[:2] + ["{oops"]))
    with pytest.raises(InvalidRequestError, match="do not match"):
        import_jsonl("\n".join(text.splitlines()[:-1]))  # a cell missing
    lines = export_jsonl(both_run).splitlines()
    cell = json.loads(lines[2])
    cell["image_png"] = '" onerror="alert(1)'
    with pytest.raises(InvalidRequestError, match="not valid base64"):
        import_jsonl("\n".join([*lines[:2], json.dumps(cell), *lines[3:]]))
    cell = json.loads(lines[1])
    cell["mark"] = "<b>"
    with pytest.raises(InvalidRequestError, match="mark must be"):
        import_jsonl("\n".join([lines[0], json.dumps(cell), *lines[2:]]))
    (tmp_path / "bad.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidRequestError, match="Could not read bad.jsonl"):
        read_run(tmp_path / "bad.jsonl")


@pytest.mark.slow
def test_compare_an_imported_run_with_a_new_run_of_the_same_set(backend, both_run):
    old = import_jsonl(export_jsonl(marked(both_run)))
    new = qa.new_run_like(old)
    assert all(c.status == "pending" and c.mark is None for c in new.cells)
    assert {c.change for c in compare_runs(old, new)} == {"not run"}
    qa.run_set(backend, new)
    changes = compare_runs(old, new)
    assert [c.change for c in changes] == ["same"] * len(old.cells)  # fixed seeds: the new run reproduces the old
    assert changes[0].old_mark == "pass" and changes[0].new_mark is None
    new.cells[0].text += " (changed)"
    new.cells[3].image_png = new.cells[1].image_png  # another image
    changes = compare_runs(old, new)
    assert [c.change for c in changes].count("changed") == 2
    assert changes[0].what == ["output"] and changes[3].what == ["output"]
    headers, rows = compare_table(changes)
    assert headers[3] == "change" and rows[0][3] == "changed" and "seconds" in rows[0][7]


def test_compare_matches_by_prompt_and_variant(chat_run):
    old = fresh(chat_run)
    new = qa.plan_run(parse_settings(["--models", "tiny", "--device", "cpu", "--sizes", "64x64,96x64"], env={}),
                      "Say hello.\nA brand new prompt", variants=CHAT_VARIANTS, run_seed=11)
    changes = compare_runs(old, new)
    kinds = [c.change for c in changes]
    assert kinds.count("only in new") == 2 and kinds.count("only in old") == 8 and kinds.count("not run") == 2


# ----- bad input --------------------------------------------------------------------------------------
@pytest.fixture
def settings(tmp_path):
    return parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path),
                           "--sizes", "64x64,96x64"], env={})


def test_prompt_files_with_per_row_settings(settings, tmp_path):
    csv_file = tmp_path / "set.csv"
    csv_file.write_text('prompt,seed,size,temperature\n"a cat, sitting",5,96x64,\nplain,,,0.9\n', encoding="utf-8")
    rows = qa.parse_prompt_set(file=csv_file, settings=settings)
    assert [(r.prompt, r.settings) for r in rows] == [("a cat, sitting", {"seed": 5, "size": "96x64"}),
                                                       ("plain", {"temperature": 0.9})]
    jsonl = tmp_path / "set.jsonl"
    jsonl.write_text('{"prompt": "x", "thinking": true, "steps": 2}\n\n{"Prompt": "y", "seed": null}\n')
    assert [(r.prompt, r.settings) for r in qa.parse_prompt_set(file=str(jsonl), settings=settings)] == [
        ("x", {"thinking": True, "steps": 2}), ("y", {})]
    run = qa.plan_run(settings, prompts_file=csv_file, variants="hot: temperature=1.5", kind="both")
    first_chat, first_image, second_chat = run.cells[0], run.cells[1], run.cells[2]
    assert first_chat.settings["seed"] == 5 and first_image.settings == {"size": "96x64", "steps": 4,
                                                                        "guidance": None, "seed": 5}
    assert second_chat.settings["temperature"] == 1.5  # the variant wins over the row


def test_bad_prompt_sets(settings, tmp_path):
    for empty in ("", "  \n\n ", None):
        with pytest.raises(InvalidRequestError, match="prompt set is empty"):
            qa.parse_prompt_set(empty, settings=settings)
    with pytest.raises(InvalidRequestError, match="Could not read missing.csv"):
        qa.parse_prompt_set(file=tmp_path / "missing.csv", settings=settings)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"prompt\n\xff\xfe\xfa\n")
    with pytest.raises(InvalidRequestError, match="Could not read binary.csv.*UTF-8"):
        qa.parse_prompt_set(file=binary, settings=settings)
    (tmp_path / "set.pdf").write_text("x")
    with pytest.raises(InvalidRequestError, match=r"upload a \.jsonl, \.csv or \.txt"):
        qa.parse_prompt_set(file=tmp_path / "set.pdf", settings=settings)
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("prompt,temp,notes\nhi,0.5,x\n")
    with pytest.raises(InvalidRequestError, match=r"unknown column\(s\) 'temp', 'notes'; allowed: prompt \(required\)"):
        qa.parse_prompt_set(file=unknown, settings=settings)
    no_prompt = tmp_path / "noprompt.jsonl"
    no_prompt.write_text('{"text": "hi"}\n')
    with pytest.raises(InvalidRequestError, match="unknown column.*'text'"):
        qa.parse_prompt_set(file=no_prompt, settings=settings)
    (tmp_path / "headless.csv").write_text("seed\n1\n")
    with pytest.raises(InvalidRequestError, match="no 'prompt' column"):
        qa.parse_prompt_set(file=tmp_path / "headless.csv", settings=settings)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(InvalidRequestError, match="broken.jsonl line 2 is not valid JSON"):
        qa.parse_prompt_set(file=tmp_path / "broken.jsonl", settings=settings)
    (tmp_path / "badvalue.csv").write_text("prompt,seed\nhi,abc\n")
    with pytest.raises(InvalidRequestError, match="badvalue.csv row 2: seed must be a whole number"):
        qa.parse_prompt_set(file=tmp_path / "badvalue.csv", settings=settings)
    with pytest.raises(InvalidRequestError, match="either pasted prompts or a file"):
        qa.parse_prompt_set("hi", tmp_path / "unknown.csv", settings=settings)


def test_too_many_prompts(settings):
    with pytest.raises(InvalidRequestError, match="has 4 prompts; at most 3 are allowed"):
        qa.parse_prompt_set("a\nb\nc\nd", settings=settings, max_prompts=3)
    too_many = "\n".join(f"prompt {i}" for i in range(qa.MAX_PROMPTS + 1))
    with pytest.raises(InvalidRequestError, match=f"at most {qa.MAX_PROMPTS} are allowed"):
        qa.plan_run(settings, too_many)
    assert len(qa.plan_run(settings, too_many.rsplit("\n", 1)[0]).cells) == qa.MAX_PROMPTS


def test_bad_variants(settings):
    with pytest.raises(UnsupportedSizeError, match="size 1024x1024 is not one of .* allowed: 64x64, 96x64"):
        qa.plan_run(settings, "hi", variants="big: size=1024x1024", kind="image")
    with pytest.raises(UnsupportedSizeError, match="variant 'b'.*allowed: 64x64, 96x64"):
        qa.parse_variants([{"name": "a", "size": "64x64"}, {"name": "b", "size": [128, 128]}], settings=settings)
    cases = {
        "x: temperature=hot": "temperature must be a number",
        "x: temperature=0": "temperature must be above 0",
        "x: steps=1000": "steps must be from 1 to 50",
        "x: colour=red": "unknown setting 'colour'",
        "x: seed=1\nx: seed=2": "Two variants are named 'x'",
        "just words": "Variant line 1 is not 'name: key=value",
        "\n".join(f"v{i}: seed={i}" for i in range(qa.MAX_VARIANTS + 1)): f"at most {qa.MAX_VARIANTS}",
        '[{"name": "a", "thinking": "maybe"}]': "thinking must be true or false",
        "[oops": "not valid JSON",
    }
    for text, message in cases.items():
        with pytest.raises(InvalidRequestError, match=message):
            qa.parse_variants(text, settings=settings)
    with pytest.raises(InvalidRequestError, match="size only apply to image cells, but this run is chat only"):
        qa.plan_run(settings, "hi", variants="v: size=64x64")
    with pytest.raises(InvalidRequestError, match="choose chat, image or both"):
        qa.plan_run(settings, "hi", kind="video")
    with pytest.raises(InvalidRequestError, match="image engine is disabled"):
        qa.plan_run(settings.replace(image=False), "hi", kind="both")


def test_variant_text_syntax(settings):
    variants = qa.parse_variants('# comment\ncold: temperature=0.2, seed=1\n\nsys: system_prompt="Be brief, ok?", '
                                 "thinking=on\nsteps=2, size=96x64\nbaseline:", settings=settings)
    assert [(v.name, v.settings) for v in variants] == [
        ("cold", {"temperature": 0.2, "seed": 1}), ("sys", {"system_prompt": "Be brief, ok?", "thinking": True}),
        ("steps=2, size=96x64", {"steps": 2, "size": "96x64"}), ("baseline", {})]
    assert qa.parse_variants(None, settings=settings) == [qa.Variant("default")]
    assert qa.parse_variants('{"a": {"seed": 1}, "b": {"greedy": true}}', settings=settings) == [
        qa.Variant("a", {"seed": 1}), qa.Variant("b", {"greedy": True})]


@pytest.mark.slow
def test_qa_modules_do_not_import_gradio():
    code = "import sys, tools.qa.runs, tools.qa.report; assert 'gradio' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120).returncode == 0


def test_cell_image_round_trips_png(both_run):
    cell = next(c for c in both_run.cells if c.kind == "image")
    raw = base64.b64decode(cell.image_png)
    assert raw.startswith(b"\x89PNG") and qa_grid.cell_image(cell).size == (64, 64)
    assert qa_grid.cell_image(cell).text["showcase"]  # the cell's parameters are embedded in the PNG
    captions = [caption for _, caption in qa_grid.gallery_items(both_run)]
    assert len(captions) == 4 and captions[0].startswith("cell 2 · #1 · small · 64x64 · seed ")
