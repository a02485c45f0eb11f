"""The QA bench in Arabic: the text built at run time (status line, grid, summary, speed and compare
tables, A/B review, toasts) and the backend's refusals (prompt sets, variants, expectations, imports) read
Arabic on an Arabic page, and exactly as before in English (the CLI, the exports and API clients read English).

The unit tests build the views from planned runs whose cells are filled in by hand (no model runs); the browser
test runs a 2 x 2 set on the demo chat engine. Screenshot: test-artifacts/screenshots/i18n-qa-ar.png.

The tab's Run set handler also takes a prompt set with its reference images in one upload: the last tests run it
on the tiny image model against the CLI's run of the same set, and check each refusal of an upload.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gradio as gr
import pytest
from support.i18n_check import english_phrases, has_arabic

from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import LRI, PDI, tr
from neuron_backend.settings import parse_settings
from tools.qa import ab as qa_ab
from tools.qa import grid as qa_grid
from tools.qa import runs as qa
from tools.qa import views as v
from tools.qa.compare import changed_only, compare_runs, compare_table
from tools.qa.expect import judge
from tools.qa.inputs import parse_prompt_set
from tools.qa.report import export_jsonl, import_jsonl, read_run
from ui import i18n

SETTINGS = parse_settings(["--models", "tiny", "--device", "cpu", "--sizes", "64x64,96x64"], env={})


def _arabic(text: str, allowed: tuple[str, ...] = ()) -> None:
    assert has_arabic(text), text
    assert not english_phrases(text, allowed=allowed), (english_phrases(text, allowed=allowed), text)


def _done_run(kind: str = "chat", variants: str = "cold: temperature=0.3, seed=1\nhot: temperature=1.2, seed=1"):
    """A planned 2-prompt run with every cell filled in as if it ran (one failed, one with a failing check)."""
    run = qa.plan_run(SETTINGS, "Say hello.\nName a colour.", variants=variants, kind=kind)
    run.rows[0].expect = {"contains": "hello", "max_tokens": 2}
    for i, cell in enumerate(run.cells):
        cell.status = qa.DONE
        if cell.kind == "chat":
            cell.text, cell.stats = f"answer {i} from the model", {"new_tokens": 5, "tokens_per_s": 12.5,
                                                                  "time_to_first_token_s": 0.1, "compiled_graphs": 1}
        else:
            cell.stats = {"seconds": 0.5, "compiled_graphs": 0}
        cell.seconds = 0.2
        cell.auto, cell.auto_reason = judge(run.rows[cell.prompt_index].expect, cell)
    run.cells[-1].status, run.cells[-1].error = qa.FAILED, InvalidRequestError.__name__
    run.cells[1].mark = "pass"
    return run


def test_grid_summary_and_speed_tables_read_arabic():
    run = _done_run()
    english_headers, english_rows = qa_grid.results_table(run)
    assert english_headers == ["#", "prompt", "cold", "hot"]
    assert english_rows[0][2].startswith("auto fail: does not contain 'hello'; 5 new tokens > max_tokens 2")
    assert qa_grid.summary_line(run) == "cold: 0 passed · 1 failed · 1 unmarked | hot: 1 passed · 0 failed · 1 unmarked"
    assert qa_grid.speed_headers()[:3] == ["cell", "prompt #", "variant"] == qa_grid.SPEED_HEADERS[:3]
    assert qa_grid.summary_headers()[-1] == "cells that compiled"
    with i18n.speaking("ar"):
        headers, rows = qa_grid.results_table(run, lang=i18n.lang())
        assert headers[:2] == ["#", "الموجّه"] and headers[2:] == ["cold", "hot"]  # variant names are data
        marked, failed_check, unrun = rows[0][3], rows[0][2], rows[1][3]
        _arabic(marked.replace("answer 1 from the model", ""))
        assert "answer 1 from the model" in marked  # the model's output is shown as it is
        assert "✅ نجح" in marked and "آليًا: فشل" in failed_check and f"لا يحتوي على {LRI}'hello'{PDI}" in failed_check
        _arabic(unrun)
        for header in (*qa_grid.summary_headers("ar"), *qa_grid.speed_headers("ar")):
            assert has_arabic(header) or header in ("TTFT s",), header
        _arabic(qa_grid.summary_line(run, "ar"))
        speed = qa_grid.speed_rows(run, "ar")
        assert speed[0][3:6] == ["محادثة", "اكتملت", "فشل"] and speed[-1][4] == "فشلت" and speed[0][-1] == "⚠ ترجمة"
        pending = copy.deepcopy(run)
        pending.cells[0].status = qa.PENDING
        _arabic(qa_grid.results_table(pending, lang="ar")[1][0][2].split("\n")[-1])  # "— not run (Run set resumes)"


def test_image_cells_gallery_and_both_columns_read_arabic():
    run = _done_run("both", "small: size=64x64, steps=1, greedy=true\nwide: size=96x64, steps=1, seed=7")
    headers, rows = qa_grid.results_table(run, lang="ar")
    assert headers[2] == "small · محادثة" and headers[3] == "small · صورة"
    _arabic(rows[0][3])  # "🖼 64x64 · seed … · 1 steps · 0.5 s"
    assert "اختيار جشِع" in rows[0][2]  # greedy
    assert "\n🖼 64x64 · seed " in qa_grid.results_table(run)[1][0][3]  # English as before


def test_ui_views_status_lines_and_toasts_in_arabic():
    from tools.qa import tab as qa_tab

    run = _done_run()
    assert qa_tab._done_line(run).startswith("3/4 cells done · cold: 0 passed")
    with i18n.speaking("ar"):
        _arabic(qa_tab._done_line(run))
        _arabic(i18n.say("Finished: {line}", line=qa_tab._done_line(run)))
        _arabic(i18n.say("Stopped: {line}", line=qa_tab._done_line(run)))
        grid, _, summary, speed = v.views(run)
        assert grid["value"]["headers"][1] == "الموجّه" and summary["value"]["headers"][0] == "المتغيّر"
        assert has_arabic(speed["value"]["headers"][0])
        assert has_arabic(v.ab_view(run)[0])
        with pytest.raises(Exception) as refused:
            v.refuse(InvalidRequestError(tr("Start a blind A/B review first: choose two variants.")))
        _arabic(str(refused.value), ("A/B",))
    assert v.ab_view(run)[0] == "Choose two variants and start a blind review."


def test_blind_review_and_its_result_read_arabic():
    run = _done_run()
    qa_ab.start(run, "cold", "hot", seed=3)
    with i18n.speaking("ar"):
        heading, _, left, _, _, progress = v.ab_view(run)
        assert heading.startswith(f"الزوج 1 من 2 · محادثة · الموجّه #1: {LRI}Say hello.{PDI}")
        _arabic(progress)
        qa_ab.pick(run, 0, "left")
        qa_ab.reveal(run)
        done, *_, result = v.ab_view(run)
        _arabic(done)
        first, *lines = result.splitlines()
        assert first.startswith("cold مقابل hot: ") and "تعادل 0" in first
        assert "اليسار" in lines[0] and "دون اختيار" in lines[1]
    result = v.ab_result(run)
    assert result.startswith("cold vs hot: ") and " -> left (" in result and "-> unpicked (unpicked)" in result


def test_compare_view_reads_arabic():
    old = _done_run()
    new = copy.deepcopy(old)
    new.cells[0].text, new.cells[2].status = "another answer", qa.FAILED
    changes = compare_runs(old, new)
    headers, rows = compare_table(changes, only_changed=True)
    assert headers[:4] == ["prompt", "variant", "kind", "change"] and rows[0][3:5] == ["changed", "output"]
    assert "status: done -> failed" in rows[1][4]
    with i18n.speaking("ar"):
        grid, diffs, _ = v.compare_view(old, new, True)
        assert has_arabic(grid["label"]) and not english_phrases(grid["label"])
        value = grid["value"]
        assert value["headers"][0] == "الموجّه" and value["rows" if "rows" in value else "data"][0][3] == "تغيّرت"
        assert value["data"][1][4].startswith("الحالة: اكتملت ← فشلت")
        assert "محادثة" in diffs["value"].splitlines()[0] and diffs["visible"]
    assert changed_only(old, new)[0].caption.startswith("#1 · cold · chat: output")


def _bad_set(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return str(path)


VARIANT_CASES = {
    "line syntax": "cold: temperature",
    "unknown setting": "cold: warmth=1",
    "out of range": "cold: temperature=9",
    "not a number": "cold: top_k=many",
    "not a bool": "cold: thinking=maybe",
    "too many": "\n".join(f"v{i}: seed={i}" for i in range(9)),
    "named twice": "a: seed=1\na: seed=2",
    "name too long": "x" * 50 + ": seed=1",
    "size not precompiled": "big: size=128x128",
    "not an object": '[1, 2]',
    "bad quote": 'a: system_prompt="x',
    "stray settings": "img: steps=2",
}


@pytest.mark.parametrize("case", sorted(VARIANT_CASES))
def test_variant_refusals_read_arabic(case):
    with pytest.raises(InvalidRequestError) as refused:
        qa.plan_run(SETTINGS, "Say hello.", variants=VARIANT_CASES[case], kind="chat")
    english = str(refused.value)
    with i18n.speaking("ar"):
        arabic = i18n.localized(refused.value)
    assert arabic != english, english
    _arabic(arabic)


SET_FILES = {
    "empty.txt": "",
    "set.pdf": "x",
    "no_prompt.csv": "seed\n1\n",
    "unknown.csv": "prompt,colour\nhi,red\n",
    "twice.csv": "prompt,prompt\na,b\n",
    "extra.csv": "prompt\na,b\n",
    "not_object.jsonl": "[1]\n",
    "bad_json.jsonl": '{"prompt": \n',
    "empty_prompt.jsonl": '{"prompt": ""}\n',
    "bad_regex.jsonl": '{"prompt": "a", "regex": "("}\n',
    "bad_max_tokens.jsonl": '{"prompt": "a", "max_tokens": "lots"}\n',
    "bad_seed.jsonl": '{"prompt": "a", "seed": "x"}\n',
    "long_contains.jsonl": json.dumps({"prompt": "a", "contains": "x" * 3000}) + "\n",
}
# Python's own parser details (json, regex) are quoted as they are: a technical detail in parentheses.
PARSER_DETAILS = ("Expecting value", "missing ), unterminated subpattern")


@pytest.mark.parametrize("name", sorted(SET_FILES))
def test_prompt_set_refusals_read_arabic(tmp_path, name):
    with pytest.raises(InvalidRequestError) as refused:
        parse_prompt_set(file=_bad_set(tmp_path, name, SET_FILES[name]), settings=SETTINGS)
    with i18n.speaking("ar"):
        _arabic(i18n.localized(refused.value), PARSER_DETAILS)
    assert i18n.localized(refused.value) == str(refused.value)  # outside an Arabic page: the English text


def test_pasted_set_refusals_and_english_unchanged():
    cases = [("", "The prompt set is empty: paste one prompt per line"),
             ("\n".join(f"p{i}" for i in range(101)), "The prompt set has 101 prompts; at most 100 are allowed"),
             ("x" * (SETTINGS.max_prompt_chars + 1), f"Prompt 1 is {SETTINGS.max_prompt_chars + 1} characters")]
    for text, english in cases:
        with pytest.raises(InvalidRequestError, match=english.replace("(", r"\(")) as refused:
            parse_prompt_set(text, settings=SETTINGS)
        with i18n.speaking("ar"):
            _arabic(i18n.localized(refused.value))


def _export_lines(run) -> list[str]:
    return export_jsonl(run).splitlines()


@pytest.mark.parametrize("damage", ["not a run", "version", "kind", "too many cells", "cell status", "mark",
                                    "fields", "png", "ab", "layout"])
def test_import_refusals_read_arabic(damage):
    run = _done_run()
    lines = _export_lines(run)
    head, cells = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    if damage == "not a run":
        head["format"] = "other"
    elif damage == "version":
        head["version"] = 99
    elif damage == "kind":
        head["kind"] = "video"
    elif damage == "too many cells":
        cells = cells + cells
    elif damage == "cell status":
        cells[0]["status"] = "lost"
    elif damage == "mark":
        cells[0]["mark"] = "great"
    elif damage == "fields":
        cells[0]["colour"] = "red"
    elif damage == "png":
        cells[0]["image_png"] = "abc"
        cells[0]["kind"] = "image"
    elif damage == "ab":
        head["ab"] = {"variants": ["cold"]}
    elif damage == "layout":
        cells = cells[:-1]
    text = "\n".join(json.dumps(x) for x in (head, *cells))
    with pytest.raises(InvalidRequestError) as refused:
        import_jsonl(text, SETTINGS)
    with i18n.speaking("ar"):
        _arabic(i18n.localized(refused.value))


def test_import_file_limits_and_other_refusals_read_arabic(tmp_path, monkeypatch):
    from tools.qa import report

    monkeypatch.setattr(report, "MAX_IMPORT_BYTES", 10)
    path = _bad_set(tmp_path, "run.jsonl", export_jsonl(_done_run()))
    refusals = []
    for action in (lambda: read_run(path, SETTINGS), lambda: read_run(tmp_path / "missing.jsonl", SETTINGS),
                   lambda: qa.set_mark(_done_run(), 0, "great"), lambda: qa.set_mark(_done_run(), 9, "pass"),
                   lambda: qa_ab.start(_done_run(), "cold", "cold"), lambda: qa_ab.start(_done_run(), "x", "hot"),
                   lambda: qa.plan_run(SETTINGS, "a", kind="video")):
        with pytest.raises(InvalidRequestError) as refused:
            action()
        refusals.append(refused.value)
    assert str(refusals[0]) == "run.jsonl is larger than 0 MB, the most a QA run import may be."
    with i18n.speaking("ar"):
        for exc in refusals:
            _arabic(i18n.localized(exc), ("No such file or directory",))  # the OS's own words, quoted


def test_a_failed_cell_keeps_its_message_translatable():
    """A cell that failed with a backend Message shows it in Arabic in the grid; its export stays English."""
    run = _done_run()
    run.cells[0].status, run.cells[0].error = qa.FAILED, tr("Choose two different variants to compare blind.")
    with i18n.speaking("ar"):
        _arabic(qa_grid.results_table(run, lang="ar")[1][0][2], ("A/B",))
    assert "Choose two different variants" in export_jsonl(run)
    assert import_jsonl(export_jsonl(run)) == run




# ----- an uploaded set with its reference images -------------------------------------------------------
UPLOAD_ARGS = ["--models", "tiny", "--device", "cpu", "--sizes", "64x64", "--references", "0,1,2", "--no-chat"]
EDIT_ROWS = [{"prompt": "make it blue", "references": ["cat.png", "refs/dog.png"], "fit": "crop"},
             {"prompt": "a lighthouse"}]


def _picture(path, colour):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (80, 50), colour).save(path)
    return path


def _uploaded(tmp_path, rows=EDIT_ROWS, images=("cat.png", "dog.png"), extra_sets=()):
    """The paths Gradio hands the tab: each uploaded file in a temporary folder of its own."""
    colours = {"cat.png": (200, 30, 30), "dog.png": (30, 30, 200)}
    paths = [_picture(tmp_path / "upload" / f"image{i}" / name, colours.get(name, (9, 9, 9)))
             for i, name in enumerate(images)]
    for i, name in enumerate(("set.jsonl", *extra_sets)):
        folder = tmp_path / "upload" / f"set{i}"
        folder.mkdir(parents=True)
        (folder / name).write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
        paths.insert(1 + i, folder / name)
    return [str(p) for p in paths]


@pytest.fixture(scope="module")
def qa_page(tmp_path_factory):
    """The app's QA bench on the tiny image model with 0-2 reference slots, and its Run set handler."""
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    from tools.demo_models import plugin as demo_builder
    from tools.qa.plugin import TAB
    from ui import create_demo

    settings = parse_settings([*UPLOAD_ARGS, "--cache-dir", str(tmp_path_factory.mktemp("qa-tab"))], env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    assert backend.status()["ready"]
    press = next(f.fn for f in create_demo(backend, tabs=[TAB]).fns.values() if f.name == "press_run")

    def press_run(upload, text=None, variants="one: steps=1, seed=5"):
        """Every update of one Run set press (the page's request and progress bar stood in for)."""
        return list(press(text, upload, "image", variants, 0, None, lambda *a, **k: None))

    return backend, press_run


@pytest.mark.slow
def test_an_uploaded_set_runs_with_its_reference_images_as_the_cli_does(qa_page, tmp_path):
    import hashlib

    backend, press_run = qa_page
    upload = _uploaded(tmp_path)
    run = press_run(upload)[-1][0]
    assert [c.status for c in run.cells] == [qa.DONE] * 2, [c.error for c in run.cells]
    digest = {Path(p).name: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in upload}
    assert run.cells[0].settings["references"] == [
        {"name": "cat.png", "sha256": digest["cat.png"], "fit": "crop"},
        {"name": "refs/dog.png", "sha256": digest["dog.png"], "fit": "crop"}]  # as the set names them
    assert "references" not in run.cells[1].settings
    # The CLI's run of the same set, its images beside it: the same cells and the same images.
    folder = tmp_path / "cli"
    _picture(folder / "cat.png", (200, 30, 30))
    _picture(folder / "refs" / "dog.png", (30, 30, 200))
    (folder / "set.jsonl").write_text("\n".join(json.dumps(r) for r in EDIT_ROWS) + "\n", encoding="utf-8")
    cli = qa.plan_run(backend.settings, prompts_file=folder / "set.jsonl", variants="one: steps=1, seed=5",
                      kind="image")
    qa.run_set(backend, cli)
    assert cli.rows == run.rows  # names, sha256 and fit modes (the local paths differ)
    assert [c.settings for c in cli.cells] == [c.settings for c in run.cells]
    assert [c.image_png for c in cli.cells] == [c.image_png for c in run.cells]
    assert all(c.image_png for c in run.cells)


UPLOAD_REFUSALS = {  # what is uploaded -> the toast's words
    "two sets": ({"extra_sets": ("other.csv",)},
                 r"^2 prompt set files were uploaded \(set.jsonl, other.csv\); upload one set file \(.jsonl, .csv or "
                 r".txt\), with its reference images\.$"),
    "a reference missing": ({"images": ("cat.png",)},
                            r"^set.jsonl line 1: reference image\(s\) 'refs/dog.png' were not uploaded; upload them "
                            r"together with the prompt set file \(they are matched by file name\)\.$"),
    "both missing": ({"images": ()},
                     r"^set.jsonl line 1: reference image\(s\) 'cat.png', 'refs/dog.png' were not uploaded; upload "
                     r"them together with the prompt set file"),
    "too many references": ({"rows": [{"prompt": "x", "references": ["cat.png", "dog.png", "cow.png"]}],
                             "images": ("cat.png", "dog.png", "cow.png")},
                            r"^set.jsonl line 1: 3 reference images are not served here .*Allowed counts: 0, 1, 2\.$"),
    "a reference too large": ({"rows": [{"prompt": "x", "references": ["cat.png"]}]},
                              r"^set.jsonl line 1: Reference .*cat.png.* is \d+x\d+ pixels; this server takes "
                              r"references of at most 100 pixels"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(UPLOAD_REFUSALS))
def test_an_upload_is_refused_with_what_to_upload(qa_page, tmp_path, monkeypatch, case):
    from neuron_backend.image import references as engine_references

    backend, press_run = qa_page
    given, words = UPLOAD_REFUSALS[case]
    if case == "a reference too large":
        monkeypatch.setattr(engine_references, "MAX_REFERENCE_PIXELS", 100)
    with pytest.warns(UserWarning, match=words):
        updates = press_run(_uploaded(tmp_path, **given))
    assert len(updates) == 1 and all(u == gr.skip() for u in updates[0])  # nothing ran, nothing was wiped


@pytest.mark.slow
def test_a_lone_set_file_and_lone_images_upload_as_before_or_are_refused(qa_page, tmp_path):
    _, press_run = qa_page
    lone = tmp_path / "alone" / "set.txt"
    lone.parent.mkdir()
    lone.write_text("a lighthouse\n", encoding="utf-8")
    run = press_run([str(lone)])[-1][0]
    assert [c.status for c in run.cells] == [qa.DONE] and run.rows[0].references == []
    assert press_run(str(lone))[-1][0].cells[0].image_png == run.cells[0].image_png  # one path, as before
    images = [p for p in _uploaded(tmp_path / "images-only") if p.endswith(".png")]  # no set file
    with pytest.warns(UserWarning, match=r"^Images were uploaded without a prompt set file; upload the set file"):
        press_run(images, text="a lighthouse")
    twin = _picture(tmp_path / "elsewhere" / "cat.png", (1, 2, 3))
    with pytest.warns(UserWarning, match=r"^Two uploaded images are named 'cat.png'; references are matched by file"):
        press_run([*_uploaded(tmp_path / "twins"), str(twin)])


@pytest.mark.slow
def test_an_image_cell_without_steps_runs_the_models_own_default(tmp_path, demo_models):
    """A non-distilled checkpoint: a cell that names no steps runs 50, as the Image tab offers (not klein's 4)."""
    from support.model_folders import non_distilled_copy

    from neuron_backend.runtime import Backend
    from tools.qa.plugin import TAB
    from ui import create_demo

    base = non_distilled_copy(demo_models.image, tmp_path / "base")
    backend = Backend(parse_settings(["--models", "full", "--device", "cpu", "--sizes", "64x64", "--references", "0",
                                      "--no-chat", "--image-model", str(base), "--cache-dir", str(tmp_path)], env={}))
    backend.runner.run()
    press = next(f.fn for f in create_demo(backend, tabs=[TAB]).fns.values() if f.name == "press_run")
    run = list(press("a lighthouse", None, "image", "one: seed=5", 0, None, lambda *a, **k: None))[-1][0]
    assert [c.status for c in run.cells] == [qa.DONE], [c.error for c in run.cells]
    import base64
    import io

    from PIL import Image

    made = json.loads(Image.open(io.BytesIO(base64.b64decode(run.cells[0].image_png))).text["showcase"])
    assert run.cells[0].settings["steps"] == 50 and made["steps"] == 50
