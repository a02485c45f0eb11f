"""/edit_image through gradio_client: reference files in, fitted and recorded; refusals say what is allowed."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image
from support.app import start_app

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from neuron_backend.image.png_info import INFOTEXT_KEY  # noqa: E402
from tools.paste_back.png_settings import read_settings  # noqa: E402
from ui.presentation import python_snippet  # noqa: E402


@pytest.fixture(scope="module")
def editing(tmp_path_factory):
    """An app serving 0, 1 or 2 references at each size (the test app's default is text-to-image only)."""
    demo, backend, url = start_app(tmp_path_factory.mktemp("editing"), "--references", "0,1,2")
    yield backend, Client(url, verbose=False)
    demo.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("refs")
    rng = np.random.default_rng(0)
    paths = []
    for name, size in (("cat.png", (150, 90)), ("dog.jpg", (70, 110)), ("bird.png", (64, 64))):
        path = folder / name
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        paths.append(path)
    (folder / "notes.txt").write_text("not an image")
    Image.new("1", (2049, 2048)).save(folder / "big.png")  # a few KB, over the 4 MP limit of sizes this small
    return folder, paths


@pytest.mark.slow
def test_edit_records_each_reference_and_pastes_back(editing, files):
    backend, client = editing
    _, (cat, dog, _) = files
    path, params = client.predict(prompt="make it night", references=[handle_file(str(cat)), handle_file(str(dog))],
                                  fit="letterbox,crop", size="96x64", steps=2, seed=7, api_name="/edit_image")
    assert Image.open(path).size == (96, 64)
    assert params["references"] == [
        {"sha256": hashlib.sha256(cat.read_bytes()).hexdigest(), "original_size": "150x90", "fitted_size": "96x64",
         "fit": "letterbox", "name": "cat.png"},
        {"sha256": hashlib.sha256(dog.read_bytes()).hexdigest(), "original_size": "70x110", "fitted_size": "96x64",
         "fit": "crop", "name": "dog.jpg"},
    ]
    png = Image.open(path)
    assert json.loads(png.text["showcase"])["references"] == params["references"]
    assert "References: letterbox " in png.text[INFOTEXT_KEY] and "150x90->96x64" in png.text[INFOTEXT_KEY]
    pasted = read_settings(path, backend.settings)
    assert (pasted.prompt, pasted.size, pasted.steps, pasted.seed) == ("make it night", "96x64", 2, 7)
    assert pasted.fit == "letterbox,crop" and [r["name"] for r in pasted.references] == ["cat.png", "dog.jpg"]
    assert any("edited from 2 reference images, which a PNG cannot carry: add them again (cat.png, dog.jpg"
               in str(note) for note in pasted.notes)
    code = python_snippet("http://127.0.0.1:7860/", params)
    assert "handle_file('cat.png')" in code and "fit='letterbox,crop'" in code and 'api_name="/edit_image"' in code
    # The same call again: the same pixels (fitting and seed are deterministic).
    again, _ = client.predict(prompt="make it night", references=[handle_file(str(cat)), handle_file(str(dog))],
                              fit="letterbox,crop", size="96x64", steps=2, seed=7, api_name="/edit_image")
    assert np.array_equal(np.asarray(Image.open(again)), np.asarray(Image.open(path)))
    assert client.predict(api_name="/status")["limits"]["references"] == [0, 1, 2]


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"references": 3}, "3 reference images are not served here (each count is compiled ahead of time). "
                        "Allowed counts: 0, 1, 2."),
    ({"references": 1, "fit": "stretch"}, "Fit mode 'stretch' is not known: use letterbox, crop."),
    ({"references": 2, "fit": "crop,crop,crop"}, "3 fit modes for 2 references"),
    ({"references": "text"}, "'notes.txt' is not an image that can be read; send PNG, JPEG, WEBP."),
    ({"references": "big"}, "'big.png' is 2049x2048 pixels; this server takes references of at most 4194304 pixels "
                            "(4.0 megapixels). Send a smaller image."),
    ({"references": 1, "size": "512x512"}, "not served here"),
])
def test_refusals_name_what_is_allowed_and_the_app_keeps_working(editing, files, kwargs, fragment):
    _, client = editing
    folder, paths = files
    count = kwargs.pop("references")
    named = {"text": "notes.txt", "big": "big.png"}
    refs = ([handle_file(str(folder / named[count]))] if count in named
            else [handle_file(str(p)) for p in paths[:count]])
    with pytest.raises(Exception) as caught:
        client.predict(prompt="x", references=refs, steps=1, seed=1, **{"size": "64x64", **kwargs},
                       api_name="/edit_image")
    assert fragment in str(caught.value)
    assert "Traceback" not in str(caught.value) and "/tmp" not in str(caught.value)
    path, params = client.predict(prompt="x", references=[handle_file(str(paths[2]))], size="64x64", steps=1, seed=1,
                                  api_name="/edit_image")
    assert params["references"][0]["fit"] == "letterbox" and Image.open(path).size == (64, 64)


@pytest.mark.slow
def test_no_references_is_text_to_image(editing):
    _, client = editing
    edit_path, edit_params = client.predict(prompt="a fox", references=[], size="64x64", steps=1, seed=3,
                                            api_name="/edit_image")
    plain_path, plain_params = client.predict(prompt="a fox", size="64x64", steps=1, seed=3,
                                              api_name="/generate_image")
    assert "references" not in edit_params
    assert np.array_equal(np.asarray(Image.open(edit_path)), np.asarray(Image.open(plain_path)))
