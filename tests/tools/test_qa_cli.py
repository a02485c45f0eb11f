"""``python -m tools.qa run`` against the app on loopback (tiny models): exit status, exports, same cells."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gradio_client")

from tools.qa import cli, openai_cells  # noqa: E402
from tools.qa import runs as qa  # noqa: E402
from tools.qa.report import import_jsonl, read_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(warm_app):
    return warm_app


def write_set(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_server_limits_come_from_status(served):
    backend, url = served
    settings = cli.server_settings(backend.status())
    assert [s.label for s in settings.sizes] == ["64x64", "96x64"] and settings.max_new_tokens == 200
    fallback = cli.server_settings({k: v for k, v in backend.status().items() if k != "limits"})
    assert [s.label for s in fallback.sizes] == ["64x64", "96x64"]  # an app without "limits": its warm-up shapes


def test_server_sizes_leave_the_edit_slots_out():
    tasks = [{"engine": "image", "kind": "compile", "shape": shape} for shape in ("64x64", "96x64", "64x64+1ref")]
    assert [s.label for s in cli.server_settings({"tasks": tasks, "engines": {}}).sizes] == ["64x64", "96x64"]


@pytest.mark.slow
def test_cli_passes_and_writes_the_same_cells_as_the_tab(served, tmp_path, capsys):
    backend, url = served
    set_file = write_set(tmp_path / "set.jsonl", [
        {"prompt": "Say hello.", "max_tokens": 5, "not_contains": "\u2603"},
        {"prompt": "a red fox", "image_size": "96x64"},
    ])
    out, csv_out, html_out = tmp_path / "run.jsonl", tmp_path / "run.csv", tmp_path / "run.html"
    status = cli.main(["run", str(set_file), "--variants", "v: max_new_tokens=5, greedy=true, size=96x64, steps=1",
                       "--kind", "both", "--url", url, "--out", str(out), "--csv", str(csv_out),
                       "--html", str(html_out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    run = read_run(out, backend.settings)
    assert [(c.kind, c.status, c.auto) for c in run.cells] == [("chat", "done", "pass"), ("image", "done", None),
                                                               ("chat", "done", None), ("image", "done", "pass")]
    assert "v: 2 passed · 0 failed · 2 unmarked" in printed
    # The same cells run in-process give the same answer and the same image bytes.
    local = qa.plan_run(backend.settings, prompts_file=set_file,
                        variants="v: max_new_tokens=5, greedy=true, size=96x64, steps=1", kind="both")
    qa.run_set(backend, local)
    assert [c.text for c in local.cells] == [c.text for c in run.cells]
    assert [c.image_png for c in local.cells] == [c.image_png for c in run.cells]
    assert len(list(csv.DictReader(csv_out.open(encoding="utf-8")))) == 4 and "<h1>QA run" in html_out.read_text()


@pytest.mark.slow
def test_cli_exits_1_when_an_expectation_fails(served, tmp_path):
    backend, url = served
    set_file = write_set(tmp_path / "set.jsonl", [{"prompt": "Say hello.", "contains": "\u2603 never said \u2603"},
                                                  {"prompt": "Name a colour."}])
    out = tmp_path / "run.jsonl"
    done = subprocess.run([sys.executable, "-m", "tools.qa", "run", str(set_file), "--variants",
                           "a: max_new_tokens=4, seed=1", "--variants", "b: max_new_tokens=4, seed=2", "--url", url,
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 failed an expectation (cells 1, 2)" in done.stdout and "0 failed to run" in done.stdout
    run = import_jsonl(out.read_text(encoding="utf-8"))
    assert [c.auto for c in run.cells] == ["fail", "fail", None, None]
    assert "does not contain" in run.cells[0].auto_reason


def test_cli_refuses_a_bad_set_before_running(served, tmp_path, capsys):
    backend, url = served
    set_file = write_set(tmp_path / "set.jsonl", [{"prompt": "hi", "size": "1024x1024"}])
    assert cli.main(["run", str(set_file), "--kind", "image", "--url", url, "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "size 1024x1024 is not one of this server's precompiled sizes" in capsys.readouterr().err
    assert cli.main(["run", str(set_file), "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "Could not reach the app" in capsys.readouterr().err


def both_ways(set_file, variants: list[str], kind: str, url: str, tmp_path, capsys, settings):
    """The runs of ``set_file`` through the app (``--url``) and through its /v1 (``--openai``), each exiting 0."""
    runs = []
    for name, where in (("gradio", ["--url", url]), ("v1", ["--openai", url.rstrip("/") + "/v1"])):
        out = tmp_path / f"{name}.jsonl"
        status = cli.main(["run", str(set_file), *variants, "--kind", kind, *where, "--out", str(out)])
        printed = capsys.readouterr()
        assert status == 0, [line for line in (printed.out + printed.err).splitlines() if "failed" in line]
        runs.append(read_run(out, settings))
    return runs


@pytest.mark.slow
def test_cli_through_the_openai_api_gives_the_same_cells_as_through_gradio(served, tmp_path, capsys):
    """``--openai URL/v1`` runs the same set through the openai SDK: the same limits (from /v1/models), the
    same replies (greedy and a seeded sample, thinking on and off) and the same image bytes."""
    backend, url = served
    set_file = write_set(tmp_path / "set.jsonl", [{"prompt": "Say hello.", "not_contains": "\u2603"},
                                                  {"prompt": "a red fox"}])
    variants = ["--variants", "g: max_new_tokens=6, greedy=true, size=96x64, steps=1",
                "--variants", "s: max_new_tokens=6, temperature=1.3, top_p=0.9, top_k=7, seed=11, thinking=true, "
                              "size=64x64, steps=2"]
    gradio, v1 = both_ways(set_file, variants, "both", url, tmp_path, capsys, backend.settings)
    assert [(c.kind, c.status) for c in v1.cells] == [(c.kind, "done") for c in gradio.cells]
    assert [c.settings for c in v1.cells] == [c.settings for c in gradio.cells]
    assert [c.text for c in v1.cells] == [c.text for c in gradio.cells]
    assert any(c.text for c in v1.cells if c.kind == "chat")
    assert [c.reasoning for c in v1.cells] == [c.reasoning for c in gradio.cells]
    assert [c.image_png for c in v1.cells] == [c.image_png for c in gradio.cells]
    chat = next(c for c in v1.cells if c.kind == "chat")
    assert chat.stats["new_tokens"] >= 1 and chat.stats["time_to_first_token_s"] > 0
    client = openai_cells.connect(url.rstrip("/") + "/v1", None)
    limits = openai_cells.server_settings(openai_cells.served_models(client))
    assert [s.label for s in limits.sizes] == ["64x64", "96x64"] and limits.max_new_tokens == 200


@pytest.fixture(scope="module")
def editing(tmp_path_factory):
    """An app serving 0, 1 or 2 references (the test app's default is text-to-image only): (backend, url)."""
    from support.app import start_app

    demo, backend, url = start_app(tmp_path_factory.mktemp("qa-editing"), "--references", "0,1,2")
    yield backend, url
    demo.close()


def picture(path: Path, size: tuple[int, int], colour: tuple[int, int, int], kind: str = "PNG") -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, format=kind)
    return path


@pytest.mark.slow
def test_cli_sends_a_rows_references_through_edit_image(editing, tmp_path, capsys):
    """A row with a reference file runs through /edit_image with the same bytes as in-process."""
    backend, url = editing
    assert backend.settings.references == (0, 1, 2)
    picture(tmp_path / "cat.png", (80, 50), (200, 30, 30))
    set_file = write_set(tmp_path / "set.jsonl", [{"prompt": "make it blue", "references": ["cat.png"],
                                                   "fit": "crop"}])
    variants = ["--variants", "v: size=64x64, steps=1, seed=3"]
    out = tmp_path / "run.jsonl"
    assert cli.main(["run", str(set_file), *variants, "--kind", "image", "--url", url, "--out", str(out)]) == 0, \
        capsys.readouterr()
    run = read_run(out, backend.settings)
    assert run.cells[0].settings["references"][0]["name"] == "cat.png"
    local = qa.plan_run(backend.settings, prompts_file=set_file, variants="v: size=64x64, steps=1, seed=3",
                        kind="image")
    qa.run_set(backend, local)
    assert local.cells[0].image_png == run.cells[0].image_png


def _showcase(cell) -> dict:
    """The parameters a cell's PNG records (its ``showcase`` text chunk)."""
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(cell.image_png))) as png:
        return json.loads(png.info["showcase"])


@pytest.mark.slow
def test_cli_through_the_openai_api_edits_as_through_gradio(editing, tmp_path, capsys):
    """``--openai URL/v1`` sends a row's reference files through /v1/images/edits (the SDK's images.edit) with
    the row's fit modes: the same image bytes and the same recorded references as through /edit_image."""
    backend, url = editing
    cat = picture(tmp_path / "refs" / "cat.png", (80, 50), (200, 30, 30))
    dog = picture(tmp_path / "dog.jpg", (40, 90), (10, 160, 40), "JPEG")
    set_file = write_set(tmp_path / "set.jsonl", [
        {"prompt": "make it blue", "references": ["refs/cat.png"], "fit": "crop"},
        {"prompt": "the cat beside the dog", "references": ["refs/cat.png", "dog.jpg"], "fit": "letterbox,crop"},
        {"prompt": "a lighthouse"},
    ])
    variants = ["--variants", "a: size=64x64, steps=1, seed=3", "--variants", "b: size=96x64, steps=2, seed=4"]
    gradio, v1 = both_ways(set_file, variants, "image", url, tmp_path, capsys, backend.settings)
    assert [c.status for c in v1.cells] == ["done"] * 6
    assert [c.settings for c in v1.cells] == [c.settings for c in gradio.cells]
    sha = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in (("cat", cat), ("dog", dog))}
    assert [[(r["sha256"], r["fit"]) for r in c.settings.get("references") or ()] for c in v1.cells] == \
        [[(sha["cat"], "crop")]] * 2 + [[(sha["cat"], "letterbox"), (sha["dog"], "crop")]] * 2 + [[], []]
    recorded = [_showcase(c).get("references") for c in v1.cells]
    assert recorded == [_showcase(c).get("references") for c in gradio.cells]
    assert [[(r["name"], r["sha256"], r["fit"], r["fitted_size"]) for r in refs or ()] for refs in recorded] == [
        [("cat.png", sha["cat"], "crop", "64x64")], [("cat.png", sha["cat"], "crop", "96x64")],
        [("cat.png", sha["cat"], "letterbox", "64x64"), ("dog.jpg", sha["dog"], "crop", "64x64")],
        [("cat.png", sha["cat"], "letterbox", "96x64"), ("dog.jpg", sha["dog"], "crop", "96x64")], [], []]
    assert recorded[4:] == [None, None]  # a text-to-image cell records no references
    assert [c.image_png for c in v1.cells] == [c.image_png for c in gradio.cells]
    assert len({c.image_png for c in v1.cells}) == 6  # each row and variant its own image


@pytest.mark.slow
def test_an_openai_edit_on_a_server_that_does_not_edit_fails_its_cell_with_the_servers_message(served, tmp_path,
                                                                                                capsys):
    backend, url = served
    assert backend.settings.references == (0,)
    picture(tmp_path / "cat.png", (80, 50), (200, 30, 30))
    set_file = write_set(tmp_path / "set.jsonl", [{"prompt": "make it blue", "references": ["cat.png"]},
                                                  {"prompt": "a red fox"}])
    out = tmp_path / "v1.jsonl"
    assert cli.main(["run", str(set_file), "--variants", "v: size=64x64, steps=1", "--kind", "image",
                     "--openai", url.rstrip("/") + "/v1", "--out", str(out)]) == 1
    assert "1 failed to run (cells 1)" in capsys.readouterr().out
    run = import_jsonl(out.read_text(encoding="utf-8"))
    assert [c.status for c in run.cells] == ["failed", "done"]
    assert "This server does not edit images" in run.cells[0].error and "--references 0,1" in run.cells[0].error
