"""QA bench: expectations, blind A/B, only-what-changed, speed columns, CSV export; on the tiny models."""

from __future__ import annotations

import base64
import copy
import csv
import io
import json
import threading

import pytest
from PIL import Image

from neuron_backend.errors import InvalidRequestError
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from tools.demo_models import plugin as demo_builder
from tools.qa import ab as qa_ab
from tools.qa import expect as qa_expect
from tools.qa import grid as qa_grid
from tools.qa import runs as qa
from tools.qa.compare import changed_only, compare_runs, compare_table
from tools.qa.export_csv import COLUMNS, escape_cell, export_csv
from tools.qa.html_report import export_html, summary_text
from tools.qa.inputs import SETTINGS
from tools.qa.report import export_jsonl, import_jsonl

VARIANTS = "cold: temperature=0.3, max_new_tokens=6\nhot: temperature=1.5, max_new_tokens=6"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir",
                               str(tmp_path_factory.mktemp("qa-bench")), "--sizes", "64x64,96x64"], env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    assert backend.status()["ready"]
    return backend


def write(tmp_path, name: str, lines: list[dict]) -> str:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def chat_run(backend, tmp_path_factory):
    """3 prompts x 2 variants, run once."""
    path = write(tmp_path_factory.mktemp("set"), "set.jsonl", [
        {"prompt": "Say hello.", "max_tokens": 6, "not_contains": "\u2603 never \u2603"},
        {"prompt": "Name a colour.", "contains": ["\u2603 surely absent \u2603"]},
        {"prompt": "Count to three."},
    ])
    run = qa.plan_run(backend.settings, prompts_file=path, variants=VARIANTS, run_seed=3)
    qa.run_set(backend, run)
    return run


# ----- expectations ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_expectations_pass_and_fail_on_the_tiny_models(chat_run):
    run = copy.deepcopy(chat_run)
    assert all(c.status == "done" for c in run.cells)
    assert run.rows[0].expect == {"max_tokens": 6, "not_contains": "\u2603 never \u2603"}
    first, second, third = run.cells[0], run.cells[2], run.cells[4]
    assert (first.auto, first.auto_reason) == ("pass", "all of max_tokens, not_contains hold")
    assert second.auto == "fail" and "does not contain '\u2603 surely absent \u2603'" in second.auto_reason
    assert (third.auto, third.auto_reason) == (None, "")  # no expectations: no verdict
    summary = {row[0]: row[2:5] for row in qa_grid.variant_summary(run)}
    assert summary == {"cold": [1, 1, 1], "hot": [1, 1, 1]}  # passed, failed, unmarked
    qa.set_mark(run, 2, "pass", "the reviewer disagrees")  # the mark wins over the verdict
    assert qa_expect.verdict(run.cells[2]) == "pass" and run.cells[2].auto == "fail"
    assert {row[0]: row[2:5] for row in qa_grid.variant_summary(run)}["cold"] == [2, 0, 1]
    assert "auto fail: does not contain" in qa_grid.results_table(run)[1][1][3]


def test_text_expectations_against_the_real_answer(backend, chat_run):
    """starts_with, regex and max_tokens built from a cell's real output pass; shifted ones fail."""
    cell = copy.deepcopy(chat_run.cells[0])
    text, tokens = cell.text, cell.stats["new_tokens"]
    assert text and tokens >= 1
    ok = {"starts_with": text.lstrip()[:2], "regex": "^" + qa_expect.regex.escape(text[:3]),
          "max_tokens": tokens, "contains": [text[-2:]]}
    assert qa_expect.judge(ok, cell)[0] == "pass"
    bad = {"starts_with": "\u2603" + text.lstrip()[:2], "regex": r"\A\u2603", "max_tokens": tokens - 1 or 1}
    verdict, reason = qa_expect.judge(bad, cell)
    assert verdict == "fail" and "does not start with" in reason and "no match for regex" in reason
    if tokens > 1:
        assert f"{tokens} new tokens > max_tokens {tokens - 1}" in reason


def test_image_size_expectation(backend, tmp_path):
    path = write(tmp_path, "img.jsonl", [{"prompt": "a fox", "image_size": "64x64"},
                                         {"prompt": "a boat", "image_size": "96x64"}])
    run = qa.plan_run(backend.settings, prompts_file=path, variants="v: size=64x64, steps=1", kind="image")
    qa.run_set(backend, run)
    assert [(c.auto, c.auto_reason) for c in run.cells] == [
        ("pass", "all of image_size hold"), ("fail", "image is 64x64, expected 96x64")]


def test_a_catastrophic_regex_times_out_as_a_failed_check(chat_run):
    cell = copy.deepcopy(chat_run.cells[0])
    cell.text = "a" * 5000 + "!"
    verdict, reason = qa_expect.judge({"regex": "(a+)+$"}, cell)
    assert verdict == "fail" and "too complex" in reason
    with pytest.raises(InvalidRequestError, match="at most 300"):
        qa_expect.parse_check("regex", "a" * 301, "row 1")
    with pytest.raises(InvalidRequestError, match="not a valid pattern"):
        qa_expect.parse_check("regex", "(unclosed", "row 1")
    with pytest.raises(InvalidRequestError, match="max_tokens must be a whole number"):
        qa_expect.parse_check("max_tokens", "0", "row 1")


def test_expectation_columns_in_csv_sets(backend, tmp_path):
    path = tmp_path / "set.csv"
    path.write_text("prompt,contains,max_tokens,image_size\nhi,hello,5,64x64\n", encoding="utf-8")
    rows = qa.parse_prompt_set(file=path, settings=backend.settings)
    assert rows[0].expect == {"contains": "hello", "max_tokens": 5, "image_size": "64x64"}


# ----- blind A/B ------------------------------------------------------------------------------------
def test_blind_ab_round_trip_reveals_the_right_names(chat_run):
    run = copy.deepcopy(chat_run)
    review = qa_ab.start(run, "cold", "hot", seed=5)
    assert len(review["pairs"]) == 3 and not review["revealed"]
    assert {p["left"] for p in review["pairs"]} == {"cold", "hot"}  # seed 5 shuffles the sides both ways
    wanted = ["hot", "cold", "tie"]  # what the reviewer prefers, row by row
    while (n := qa_ab.next_pair(run)) is not None:
        left, right = qa_ab.pair_cells(run, n)
        assert left.prompt_index == right.prompt_index == n and {left.variant, right.variant} == {"cold", "hot"}
        choice = "tie" if wanted[n] == "tie" else "left" if left.variant == wanted[n] else "right"
        assert not run.ab["revealed"]
        qa_ab.pick(run, n, choice)
    assert run.ab["revealed"]
    again = import_jsonl(export_jsonl(run))
    assert again == run
    assert qa_ab.tally(again) == {"wins": {"cold": 1, "hot": 1}, "ties": 1, "unpicked": 0}
    assert [p["winner"] for p in qa_ab.per_row(again)] == wanted
    page = export_html(again)
    assert "Blind A/B: cold vs hot" in page and "cold 1 · hot 1 · tie 1 · unpicked 0" in page
    rows = list(csv.DictReader(io.StringIO(export_csv(again))))
    assert [(r["variant"], r["ab_pick"]) for r in rows[:4]] == [("cold", "worse"), ("hot", "better"),
                                                               ("cold", "better"), ("hot", "worse")]
    assert {r["ab_pick"] for r in rows[4:]} == {"tie"}


def test_ab_refuses_bad_choices_and_tampered_imports(chat_run):
    run = copy.deepcopy(chat_run)
    with pytest.raises(InvalidRequestError, match="Start a blind A/B review first"):
        qa_ab.pick(run, 0, "left")
    with pytest.raises(InvalidRequestError, match="not in this run"):
        qa_ab.start(run, "cold", "warm")
    with pytest.raises(InvalidRequestError, match="two different"):
        qa_ab.start(run, "cold", "cold")
    qa_ab.start(run, "cold", "hot", seed=1)
    with pytest.raises(InvalidRequestError, match="left, right or tie"):
        qa_ab.pick(run, 0, "both")
    qa_ab.reveal(run)
    assert run.ab["revealed"] and qa_ab.tally(run)["unpicked"] == 3
    lines = export_jsonl(run).splitlines()
    head = json.loads(lines[0])
    head["ab"]["pairs"][0]["left"] = "<img src=x>"
    with pytest.raises(InvalidRequestError, match="ab must be a blind review"):
        import_jsonl("\n".join([json.dumps(head), *lines[1:]]))


# ----- only what changed ----------------------------------------------------------------------------
def test_changed_only_after_a_rerun_with_one_changed_setting(backend, chat_run):
    old = copy.deepcopy(chat_run)
    new = qa.new_run_like(old)
    new.cells[3].settings["max_new_tokens"] = 1  # prompt 2, variant "hot"
    qa.run_set(backend, new)
    changes = compare_runs(old, new)
    assert [c.change for c in changes].count("changed") == 1
    only = changed_only(old, new, changes)
    assert len(only) == 1 and only[0].change.new_index == 3
    assert "settings: max_new_tokens" in only[0].change.what
    if new.cells[3].text != old.cells[3].text:
        assert only[0].diff.startswith("--- old\n+++ new") and "output" in only[0].change.what
    assert compare_table(changes, only_changed=True)[1] == [compare_table(changes)[1][3]]
    new.cells[0].auto = "fail"  # a verdict that differs is a change, and so are two different marks
    qa.set_mark(old, 1, "pass")
    qa.set_mark(new, 1, "fail")
    whats = {c.new_index: c.what for c in compare_runs(old, new) if c.change == "changed"}
    assert whats[0] == ["verdict: pass -> fail"] and whats[1] == ["mark: pass -> fail"]
    qa.set_mark(new, 1, None)  # a fresh run without marks is not a change
    assert 1 not in {c.new_index for c in compare_runs(old, new) if c.change == "changed"}


def test_changed_images_side_by_side(backend):
    old = qa.plan_run(backend.settings, "a lighthouse", variants="v: size=64x64, steps=1", kind="image")
    qa.run_set(backend, old)
    new = qa.new_run_like(old)
    new.cells[0].settings["steps"] = 2
    qa.run_set(backend, new)
    only = changed_only(old, new)
    assert len(only) == 1 and only[0].diff == "" and only[0].image.size == (64 + 8 + 64, 64)
    assert only[0].caption.endswith("(old left, new right)")


# ----- speed columns, summary, exports ----------------------------------------------------------------
def test_speed_columns_medians_and_compiled_flag(chat_run):
    run = copy.deepcopy(chat_run)
    rows = qa_grid.speed_rows(run)
    assert len(rows) == 6 and rows[0][:4] == [1, 1, "cold", "chat"]
    ttft = qa_grid.SPEED_HEADERS.index("TTFT s")
    assert all(isinstance(r[ttft], float) and r[ttft] > 0 for r in rows)
    assert all(r[-2] == 0 and r[-1] == "" for r in rows)  # warmed up: nothing compiled
    run.cells[1].stats["compiled_graphs"] = 2
    assert qa_grid.speed_rows(run)[1][-1] == "⚠ compiled" and "⚠ compiled 2" in qa_grid.cell_summary(run.cells[1])
    summary = {row[0]: row for row in qa_grid.variant_summary(run)}
    speeds = [c.stats["tokens_per_s"] for c in run.cells if c.variant == "cold"]
    assert summary["cold"][7] == round(sorted(speeds)[1], 3) and summary["hot"][-1] == 1
    assert "⚠ 2 graph(s) compiled" in export_html(run)


def test_csv_export_escapes_formulas_and_carries_every_setting(chat_run):
    run = copy.deepcopy(chat_run)
    run.rows[0].prompt = "=HYPERLINK(\"http://x\",\"y\")"
    qa.set_mark(run, 0, "fail", "@SUM(A1)")
    run.cells[1].text = "-2+3"
    run.cells[2].text = "+cmd|' /C calc'!A0"
    rows = list(csv.reader(io.StringIO(export_csv(run))))
    assert rows[0] == COLUMNS and set(SETTINGS) <= set(rows[0]) and len(rows) == 1 + len(run.cells)
    cells = [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]
    assert cells[0]["prompt"] == "'=HYPERLINK(\"http://x\",\"y\")" and cells[0]["comment"] == "'@SUM(A1)"
    assert cells[1]["text"] == "'-2+3" and cells[2]["text"] == "'+cmd|' /C calc'!A0"
    assert cells[0]["mark"] == "fail" and cells[0]["verdict"] == "fail" and cells[0]["auto"] == "pass"
    assert cells[0]["temperature"] == "0.3" and cells[0]["size"] == "" and cells[0]["seed"].isdigit()
    assert float(cells[0]["ttft_s"]) > 0 and cells[0]["new_tokens"].isdigit()
    assert escape_cell(-1.5) == -1.5 and escape_cell("\tx") == "'\tx" and escape_cell("a=b") == "a=b"


def test_jsonl_and_html_carry_the_new_fields(chat_run):
    text = export_jsonl(chat_run)
    head, first = (json.loads(line) for line in text.splitlines()[:2])
    assert head["version"] == 2 and head["rows"][1]["expect"] == {"contains": ["\u2603 surely absent \u2603"]}
    assert first["auto"] == "pass" and first["auto_reason"]
    page = export_html(chat_run)
    assert "expect: contains" in page and 'data-auto="fail"' in page and "median tok/s" in page
    assert "0 errors" in summary_text(chat_run) and "failed" not in summary_text(chat_run).split("marked")[0]


def test_version_1_exports_still_import(chat_run):
    lines = [json.loads(line) for line in export_jsonl(chat_run).splitlines()]
    lines[0]["version"] = 1
    del lines[0]["ab"]
    for row in lines[0]["rows"]:
        del row["expect"]
    for cell in lines[1:]:
        del cell["auto"], cell["auto_reason"]
    run = import_jsonl("\n".join(map(json.dumps, lines)))
    assert run.rows[0].expect == {} and run.cells[0].auto is None and run.ab is None


def test_a_stopped_run_shows_unrun_cells_as_not_run(backend, chat_run):
    run = qa.new_run_like(chat_run)
    stop = threading.Event()
    qa.run_set(backend, run, lambda done, total, eta: stop.set() if done == 1 else None, stop)
    table = qa_grid.results_table(run)[1]
    assert table[0][3].startswith("— not run") and qa_grid.results_table(run, running=True)[1][0][3] == "… pending"


# ----- imports are bounded ----------------------------------------------------------------------------
def png_b64(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 128).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.fixture(scope="module")
def image_export(backend):
    run = qa.plan_run(backend.settings, "a cat", variants="v: size=64x64, steps=1", kind="image")
    qa.run_set(backend, run)
    return export_jsonl(run).splitlines()


def with_cell(lines: list[str], **changes) -> str:
    cell = json.loads(lines[1])
    cell.update(changes)
    return "\n".join([lines[0], json.dumps(cell)])


@pytest.mark.slow
def test_import_refuses_image_bombs_and_non_images(backend, image_export):
    bomb = png_b64(12000, 12000)
    assert len(bomb) < 400_000  # compresses to almost nothing: only the header may be trusted
    with pytest.raises(InvalidRequestError, match="the image is 12000x12000; this server's sizes are 64x64, 96x64"):
        import_jsonl(with_cell(image_export, image_png=bomb), backend.settings)
    with pytest.raises(InvalidRequestError, match="at most 4194304 pixels"):
        import_jsonl(with_cell(image_export, image_png=bomb))
    with pytest.raises(InvalidRequestError, match="not a PNG image"):
        import_jsonl(with_cell(image_export, image_png=base64.b64encode(b"GIF89a not a png").decode()))
    broken = base64.b64decode(png_b64(64, 64))
    broken = broken[:40] + b"\x00" * 8 + broken[48:]
    with pytest.raises(InvalidRequestError, match="not a readable PNG"):
        import_jsonl(with_cell(image_export, image_png=base64.b64encode(broken).decode()), backend.settings)
    assert import_jsonl("\n".join(image_export), backend.settings).cells[0].image_png


def test_import_applies_the_prompt_set_limits(backend, chat_run, monkeypatch, tmp_path):
    settings = backend.settings
    head, *cells = [json.loads(line) for line in export_jsonl(chat_run).splitlines()]

    def attempt(**changes) -> str:
        return "\n".join(map(json.dumps, [{**head, **changes}, *cells]))

    cases = {
        "7 variants; at most 6": attempt(variants=[{"name": f"v{i}", "settings": {}} for i in range(7)]),
        "two variants are named 'a'": attempt(variants=[{"name": "a", "settings": {}}, {"name": "a", "settings": {}}]),
        "at most 20000 are allowed": attempt(rows=[{"prompt": "x" * 20_001, "settings": {}, "expect": {}}]),
        "max_new_tokens must be from 1 to 64": attempt(variants=[
            {"name": "cold", "settings": {"max_new_tokens": 10**9}}, {"name": "hot", "settings": {}}]),
        "meta.models must be an object": attempt(meta={"models": "chat"}),
    }
    for message, text in cases.items():
        with pytest.raises(InvalidRequestError, match=message):
            import_jsonl(text, settings)
    huge_cell = dict(cells[0], settings={**cells[0]["settings"], "max_new_tokens": 10**9})
    with pytest.raises(InvalidRequestError, match="max_new_tokens must be from 1 to 64"):
        import_jsonl("\n".join(map(json.dumps, [head, huge_cell, *cells[1:]])), settings)
    monkeypatch.setattr("tools.qa.report.MAX_IMPORT_BYTES", 1000)
    from tools.qa.report import read_run

    (tmp_path / "big.jsonl").write_text(export_jsonl(chat_run), encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="big.jsonl is larger than"):
        read_run(tmp_path / "big.jsonl", settings)


def test_html_export_survives_odd_meta(chat_run):
    run = copy.deepcopy(chat_run)
    run.meta = {"models": "just text <img src=x>", "device": None}
    page = export_html(run)
    assert "just text &lt;img src=x&gt;" in page and "<img src=x>" not in page


# ----- hostile or malformed set files --------------------------------------------------------------------
def test_bad_set_files_get_clear_messages(backend, tmp_path):
    (tmp_path / "twice.csv").write_text("prompt,prompt\na,b\n", encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="names 'prompt' more than once"):
        qa.parse_prompt_set(file=tmp_path / "twice.csv", settings=backend.settings)
    (tmp_path / "deep.jsonl").write_text('{"prompt": "ok"}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="deep.jsonl line 2 is nested too deeply"):
        qa.parse_prompt_set(file=tmp_path / "deep.jsonl", settings=backend.settings)
    (tmp_path / "surrogate.jsonl").write_text('{"prompt": "bad \\ud800 text"}\n', encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="lone surrogate"):
        qa.parse_prompt_set(file=tmp_path / "surrogate.jsonl", settings=backend.settings)


def test_variants_as_an_object_a_list_or_one_object_per_line(backend):
    settings = backend.settings
    expected = [qa.Variant("cold", {"temperature": 0.2}), qa.Variant("hot", {"temperature": 1.2})]
    forms = ['[{"name": "cold", "temperature": 0.2}, {"name": "hot", "temperature": 1.2}]',
             '{"name": "cold", "temperature": 0.2}\n{"name": "hot", "temperature": 1.2}',
             '{"cold": {"temperature": 0.2}, "hot": {"temperature": 1.2}}']
    for form in forms:
        assert qa.parse_variants(form, settings=settings) == expected
    assert qa.parse_variants('{"name": "cold", "temperature": 0.2}', settings=settings) == expected[:1]
    assert qa.parse_variants('{"temperature": 0.2}', settings=settings) == [qa.Variant("v1", {"temperature": 0.2})]
    with pytest.raises(InvalidRequestError, match="Variants line 2 is not valid JSON"):
        qa.parse_variants('{"name": "a"}\n{"name": "b",\n{"name": "c"}', settings=settings)
    with pytest.raises(InvalidRequestError, match="Variants line 2 must be a JSON object"):
        qa.parse_variants('{"name": "a"}\n[1]', settings=settings)
    with pytest.raises(InvalidRequestError, match="Variant 2 must be a JSON object"):
        qa.parse_variants('[{"name": "a"}, 5]', settings=settings)
    with pytest.raises(InvalidRequestError, match="variant 'cold': unknown setting 'colour'"):
        qa.parse_variants('{"name": "cold", "colour": "red"}', settings=settings)


def test_huge_numbers_get_a_short_message(backend):
    for spec in ("x: seed=" + "9" * 5000, [{"name": "x", "seed": 10**5000}]):
        with pytest.raises(InvalidRequestError, match="seed must be") as caught:
            qa.parse_variants(spec, settings=backend.settings)
        assert len(str(caught.value)) < 200  # the 5,000 digits are not echoed (nor crash repr's digit limit)
