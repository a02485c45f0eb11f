"""QA bench rows with reference images: an edit per row, named in every report, reproduced on re-run; refusals."""

from __future__ import annotations

import base64
import copy
import csv
import hashlib
import io
import json

import pytest
from PIL import Image

from neuron_backend.errors import InvalidRequestError
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from tools.demo_models import plugin as demo_builder
from tools.qa import openai_cells
from tools.qa import runs as qa
from tools.qa.compare import changed_only, compare_runs
from tools.qa.export_csv import export_csv
from tools.qa.grid import results_table
from tools.qa.html_report import export_html
from tools.qa.references import RowReference
from tools.qa.report import export_jsonl, import_jsonl

ARGS = ["--models", "tiny", "--device", "cpu", "--sizes", "64x64", "--references", "0,1"]
VARIANTS = "one: steps=1, seed=5\ntwo: steps=2, seed=5"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    settings = parse_settings([*ARGS, "--cache-dir", str(tmp_path_factory.mktemp("qa-refs"))], env={})
    backend = Backend(settings, parts=demo_builder.plug(settings))
    backend.runner.run()
    assert backend.status()["ready"]
    return backend


@pytest.fixture(scope="module")
def settings():
    return parse_settings(ARGS, env={})


def picture(path, size=(80, 50), colour=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def write_set(folder, rows: list[dict], name: str = "set.jsonl"):
    path = folder / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def edit_run(backend, tmp_path_factory):
    """Row 1 edits from refs/cat.png (crop), row 2 is text-to-image; 2 variants, run once."""
    folder = tmp_path_factory.mktemp("edit-set")
    picture(folder / "refs" / "cat.png")
    path = write_set(folder, [{"prompt": "make it blue", "references": ["refs/cat.png"], "fit": "crop"},
                              {"prompt": "a lighthouse"}])
    run = qa.plan_run(backend.settings, prompts_file=path, variants=VARIANTS, kind="image")
    qa.run_set(backend, run)
    return run


@pytest.mark.slow
def test_a_reference_row_runs_names_its_reference_and_reruns_to_the_same_bytes(backend, edit_run):
    run = copy.deepcopy(edit_run)
    assert [c.status for c in run.cells] == ["done"] * 4, [c.error for c in run.cells]
    ref = run.rows[0].references[0]
    assert (ref.name, ref.fit, len(ref.sha256)) == ("refs/cat.png", "crop", 64)
    entry = {"name": "refs/cat.png", "sha256": ref.sha256, "fit": "crop"}
    assert [c.settings.get("references") for c in run.cells] == [[entry], [entry], None, None]
    png = Image.open(io.BytesIO(base64.b64decode(run.cells[0].image_png)))
    recorded = json.loads(png.info["showcase"])["references"][0]
    assert (recorded["sha256"], recorded["fit"], recorded["name"]) == (ref.sha256, "crop", "cat.png")
    assert recorded["original_size"] == "80x50" and recorded["fitted_size"] == "64x64"
    assert run.cells[0].image_png != run.cells[1].image_png  # the variants differ on the same reference
    before = run.cells[1].image_png
    assert qa.rerun_cell(backend, run, 1).image_png == before  # same file, settings and seed: same bytes
    assert qa.rerun_cell(backend, run, 3).image_png == edit_run.cells[3].image_png


@pytest.mark.slow
def test_reports_name_each_reference(edit_run, settings):
    short = edit_run.rows[0].references[0].sha256[:12]
    named = f"refs/cat.png {short} crop"
    cells = list(csv.DictReader(io.StringIO(export_csv(edit_run))))
    assert [c["references"] for c in cells] == [named, named, "", ""]
    page = export_html(edit_run)
    assert f"references: {named}" in page and page.count(f"edited from {named}") == 2
    assert f"edited from {named}" in results_table(edit_run)[1][0][2]
    text = export_jsonl(edit_run)
    assert str(edit_run.rows[0].references[0].path) not in text  # no local folder in an export
    head = json.loads(text.splitlines()[0])
    assert head["rows"][0]["references"] == [{"name": "refs/cat.png", "sha256": edit_run.rows[0].references[0].sha256,
                                              "fit": "crop"}]
    assert "references" not in head["rows"][1]  # a row without references is written as before
    assert import_jsonl(text, settings) == edit_run


@pytest.mark.slow
def test_compare_names_a_changed_reference_and_an_import_cannot_send_it(backend, edit_run, tmp_path):
    old = copy.deepcopy(edit_run)
    new = qa.new_run_like(old)
    other = picture(tmp_path / "dog.png", (40, 90), (10, 200, 10))
    new.rows[0].references[0] = RowReference("dog.png", hashlib.sha256(other.read_bytes()).hexdigest(), "crop",
                                             str(other))
    for cell in new.cells[:2]:
        cell.settings["references"] = [new.rows[0].references[0].entry()]
    qa.rerun_cell(backend, new, 0)
    change = compare_runs(old, new)[0]
    assert change.change == "changed" and any("references: refs/cat.png" in str(w) and "-> dog.png" in str(w)
                                              for w in change.what)
    caption = changed_only(old, new)[0].caption
    assert "edited from dog.png" in caption
    imported = import_jsonl(export_jsonl(old))
    failed = qa.rerun_cell(backend, imported, 0)
    assert failed.status == "failed" and "not at hand" in str(failed.error)
    assert "python -m tools.qa" in str(failed.error)


@pytest.mark.slow
def test_a_reference_changed_on_disk_fails_its_cell(backend, tmp_path):
    picture(tmp_path / "cat.png")
    run = qa.plan_run(backend.settings, prompts_file=write_set(tmp_path, [
        {"prompt": "make it blue", "references": ["cat.png"]}]), variants="one: steps=1", kind="image")
    picture(tmp_path / "cat.png", colour=(0, 0, 0))
    cell = qa.rerun_cell(backend, run, 0)
    assert cell.status == "failed" and "changed since the prompt set was read" in str(cell.error)


def test_a_csv_set_separates_references_with_semicolons(tmp_path):
    picture(tmp_path / "a.png")
    picture(tmp_path / "b" / "c.jpg")
    (tmp_path / "set.csv").write_text('prompt,references,fit\n"swap them","a.png; b/c.jpg","crop,letterbox"\n'
                                      "plain,,\n", encoding="utf-8")
    settings = parse_settings([*ARGS[:-1], "0,1,2"], env={})
    run = qa.plan_run(settings, prompts_file=tmp_path / "set.csv", kind="image")
    assert [(r.name, r.fit) for r in run.rows[0].references] == [("a.png", "crop"), ("b/c.jpg", "letterbox")]
    assert run.rows[1].references == [] and "references" not in run.cells[1].settings


@pytest.mark.parametrize(("references", "fit", "expected"), [
    (["../outside.png"], None, "no absolute path, no '..'"),
    (["/etc/hostname"], None, "no absolute path, no '..'"),
    (["missing.png"], None, "does not exist; put the file in the prompt set's folder"),
    (["notes.png"], None, "is not an image that can be read; send PNG, JPEG, WEBP"),
    (["cat.png", "cat.png"], None, "2 reference images are not served here (each count is compiled ahead of time). "
                                   "Allowed counts: 0, 1."),
    (["cat.png"], "stretch", "Fit mode 'stretch' is not known: use letterbox, crop."),
    ("cat.png", None, None),
    (7, None, "references must be a list of file paths"),
])
def test_reference_refusals_say_what_is_allowed(settings, tmp_path, references, fit, expected):
    folder = tmp_path / "set"
    picture(folder / "cat.png")
    picture(tmp_path / "outside.png")
    (folder / "notes.png").write_text("not an image", encoding="utf-8")
    row = {"prompt": "edit", "references": references, **({"fit": fit} if fit else {})}
    path = write_set(folder, [row])
    if expected is None:  # one path as text: accepted, as in a CSV cell
        assert qa.plan_run(settings, prompts_file=path, kind="image").rows[0].references[0].name == "cat.png"
        return
    with pytest.raises(InvalidRequestError) as caught:
        qa.plan_run(settings, prompts_file=path, kind="image")
    assert "set.jsonl line 1" in str(caught.value) and expected in str(caught.value)


def test_a_link_out_of_the_folder_and_fit_alone_are_refused(settings, tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    picture(tmp_path / "secret.png")
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    with pytest.raises(InvalidRequestError, match="leads outside the prompt set's folder"):
        qa.plan_run(settings, prompts_file=write_set(folder, [{"prompt": "x", "references": ["link.png"]}]))
    with pytest.raises(InvalidRequestError, match="fit applies to reference images"):
        qa.plan_run(settings, prompts_file=write_set(folder, [{"prompt": "x", "fit": "crop"}]))


def test_openai_runs_plan_references_by_the_counts_the_server_lists(tmp_path):
    """/v1/models' image ``edits`` are the counts a row may carry; a server listing none is sent any count."""
    picture(tmp_path / "cat.png")
    picture(tmp_path / "dog.png")
    path = write_set(tmp_path, [{"prompt": "edit", "references": ["cat.png", "dog.png"]}])

    def limits(**image) -> tuple:
        return openai_cells.server_settings({"image": {"id": "image", **image}})

    assert limits(edits=[2, 1]).references == (0, 1, 2)
    assert limits(edits=[]).references == limits().references == (0, 1, 2, 3, 4)
    assert qa.plan_run(limits(edits=[1, 2]), prompts_file=path, kind="image").rows[0].references[1].name == "dog.png"
    assert len(qa.plan_run(limits(), prompts_file=path, kind="image").rows[0].references) == 2
    with pytest.raises(InvalidRequestError, match="2 reference images are not served here .* Allowed counts: 0, 1"):
        qa.plan_run(limits(edits=[1]), prompts_file=path, kind="image")


def test_an_import_refuses_references_that_do_not_match_the_row(edit_run_plan):
    text = export_jsonl(edit_run_plan)
    lines = [json.loads(line) for line in text.splitlines()]
    lines[1]["settings"]["references"][0]["fit"] = "crop"
    with pytest.raises(InvalidRequestError, match="references do not match its prompt's"):
        import_jsonl("\n".join(json.dumps(line) for line in lines))
    lines[1]["settings"]["references"] = [{"name": "x.png", "sha256": "zz", "fit": "crop"}]
    with pytest.raises(InvalidRequestError, match="sha256 \\(64 hex digits\\)"):
        import_jsonl("\n".join(json.dumps(line) for line in lines))


@pytest.fixture
def edit_run_plan(settings, tmp_path):
    picture(tmp_path / "cat.png")
    return qa.plan_run(settings, prompts_file=write_set(tmp_path, [{"prompt": "edit", "references": ["cat.png"]}]),
                       kind="image")
