"""POST /v1/images/edits driven by the official ``openai`` SDK against the app on the tiny models (loopback
only): image files in, the same pixels as the engine gives for the same references and seed, the references
recorded in the PNGs; refusals that name what is allowed."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re

import httpx
import numpy as np
import pytest
from PIL import Image
from support.app import start_app

from neuron_backend.image.engine import ImageRequest
from neuron_backend.image.references import read_reference

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def editing(tmp_path_factory):
    """An app serving 0, 1 or 2 references at each size (the test app's default is text-to-image only)."""
    demo, backend, url = start_app(tmp_path_factory.mktemp("v1-edits"), "--references", "0,1,2", "--no-chat")
    yield backend, url, openai.OpenAI(base_url=url + "v1", api_key="unused: no key configured", max_retries=0)
    demo.close()


def _png(size: tuple[int, int], seed: int, kind: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, format=kind)
    return buffer.getvalue()


def _metric(text: str, name: str, **labels) -> float:
    """One sample of the Prometheus text (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{re.escape(name)}(?:\{{{re.escape(wanted)}\}})? (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _line_png() -> bytes:
    """A real PNG one pixel wide and one pixel over the 4-megapixel limit of sizes this small (a few KB)."""
    buffer = io.BytesIO()
    Image.new("1", (1, 4 * 2**20 + 1)).save(buffer, format="PNG")
    return buffer.getvalue()


def _huge_png() -> bytes:
    """A small file of more than 64 megapixels (one bit each, all black)."""
    buffer = io.BytesIO()
    Image.new("1", (8200, 8200)).save(buffer, format="PNG")
    return buffer.getvalue()


CAT, DOG = ("cat.png", _png((150, 90), 0)), ("dog.jpg", _png((70, 110), 1, "JPEG"))


def _engine_pixels(backend, prompt: str, size: str, steps: int, seed: int, files, fits) -> np.ndarray:
    """What the engine makes of the same references (read as /edit_image reads them) and seed."""
    refs = tuple(read_reference(data, fit, name) for (name, data), fit in zip(files, fits, strict=True))
    call = backend.start_image(ImageRequest(prompt=prompt, size=size, steps=steps, seed=seed, references=refs))
    assert call.wait(120)
    return np.asarray(call.result().image)


def test_two_images_edit_like_the_engine_and_record_the_references(editing):
    backend, _, client = editing
    result = client.images.edit(model="image", image=[CAT, DOG], prompt="make it night", size="96x64",
                                response_format="b64_json", extra_body={"seed": 7, "steps": 2, "fit": "letterbox,crop"})
    assert len(result.data) == 1
    expected = [{"sha256": hashlib.sha256(CAT[1]).hexdigest(), "original_size": "150x90", "fitted_size": "96x64",
                 "fit": "letterbox", "name": "cat.png"},
                {"sha256": hashlib.sha256(DOG[1]).hexdigest(), "original_size": "70x110", "fitted_size": "96x64",
                 "fit": "crop", "name": "dog.jpg"}]
    item = result.data[0]
    assert item.model_extra["parameters"]["references"] == expected
    with Image.open(io.BytesIO(base64.b64decode(item.b64_json))) as png:
        assert png.format == "PNG" and png.size == (96, 64)
        assert json.loads(png.text["showcase"])["references"] == expected
        assert "References: letterbox " in png.text["parameters"] and "150x90->96x64" in png.text["parameters"]
        pixels = np.asarray(png.convert("RGB"))
    engine = _engine_pixels(backend, "make it night", "96x64", 2, 7, [CAT, DOG], ["letterbox", "crop"])
    assert np.array_equal(pixels, engine)
    assert not np.array_equal(pixels, _engine_pixels(backend, "make it night", "96x64", 2, 7, [], []))  # refs count


def test_one_image_as_image_with_n_and_by_url(editing):
    backend, _, client = editing
    result = client.images.edit(model=backend.settings.image_model, image=CAT, prompt="a cat at dusk", n=2,
                                size="64x64", response_format="url", extra_body={"seed": 3, "steps": 1})
    assert [i.model_extra["parameters"]["seed"] for i in result.data] == [3, 4]
    answer = httpx.get(result.data[0].url)
    assert answer.status_code == 200 and answer.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(answer.content)) as png:
        assert png.size == (64, 64)
        assert json.loads(png.text["showcase"])["references"][0]["fit"] == "letterbox"
        pixels = np.asarray(png.convert("RGB"))
    assert np.array_equal(pixels, _engine_pixels(backend, "a cat at dusk", "64x64", 1, 3, [CAT], ["letterbox"]))


@pytest.mark.parametrize(("kwargs", "param", "fragment"), [
    ({"image": [CAT, DOG, CAT]}, "image", "3 reference images are not served here (each count is compiled ahead of "
                                          "time). Allowed counts: 1, 2."),
    ({"image": [("notes.txt", b"not an image")]}, "image",
     "Reference 'notes.txt' is not an image that can be read; send PNG, JPEG, WEBP."),
    ({"image": [("old.gif", _png((8, 8), 2, "GIF"))]}, "image", "Reference 'old.gif' is a GIF file; send PNG, JPEG"),
    ({"image": [CAT, ("huge.png", _huge_png())]}, "image",
     "Reference 'huge.png' is 8200x8200 pixels; this server takes references of at most 4194304 pixels "
     "(4.0 megapixels). Send a smaller image."),
    ({"image": [("line.png", _line_png())]}, "image",  # under the old fixed 64 MP: the limit comes from the sizes
     "Reference 'line.png' is 1x4194305 pixels; this server takes references of at most 4194304 pixels"),
    ({"image": [CAT], "extra_body": {"fit": "stretch"}}, "fit",
     "Fit mode 'stretch' is not known: use letterbox, crop."),
    ({"image": [CAT], "size": "512x512"}, "size", "allowed sizes: 64x64, 96x64"),
    ({"image": [CAT], "extra_body": {"steps": "many"}}, "steps", "steps must be a whole number from 1 to 50"),
    ({"image": [CAT], "mask": ("mask.png", _png((64, 64), 3))}, "mask", "mask is not supported"),
])
def test_refusals_are_400_naming_what_is_allowed(editing, kwargs, param, fragment):
    _, _, client = editing
    args = {"model": "image", "prompt": "x", "size": "64x64", **kwargs}
    args["extra_body"] = {"steps": 1, **args.get("extra_body", {})}
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.edit(**args)
    assert fragment in caught.value.body["message"] and caught.value.body["param"] == param
    assert caught.value.body["type"] == "invalid_request_error" and "Traceback" not in caught.value.body["message"]


def test_a_missing_image_and_a_json_body_are_refused(editing):
    _, url, _ = editing
    answer = httpx.post(url + "v1/images/edits", data={"model": "image", "prompt": "x"},
                        files={"other": ("a.txt", b"x")})
    assert answer.status_code == 400 and "other cannot be a file" in answer.json()["error"]["message"]
    answer = httpx.post(url + "v1/images/edits", files={"prompt": (None, "x"), "model": (None, "image")})
    assert answer.status_code == 400 and answer.json()["error"]["message"].startswith("image is required")
    assert "takes 1, 2 per request" in answer.json()["error"]["message"]
    answer = httpx.post(url + "v1/images/edits", json={"model": "image", "prompt": "x"})
    assert answer.status_code == 400 and "multipart/form-data" in answer.json()["error"]["message"]


def test_models_list_the_edit_counts_and_metrics_count_edits(editing):
    _, url, client = editing
    image = next(m for m in client.models.list() if m.model_extra["engine"] == "image")
    assert image.model_extra["edits"] == [1, 2]
    before = httpx.get(url + "metrics").text
    with pytest.raises(openai.BadRequestError):
        client.images.edit(model="image", image=[CAT, DOG, CAT], prompt="x")
    after = httpx.get(url + "metrics").text

    def grew(name, **labels):
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    assert grew("showcase_refusals_total", endpoint="/v1/images/edits", reason="bad_input") == 1
    assert grew("showcase_v1_requests_total", route="edits", status="400") == 1
    assert grew("showcase_request_duration_seconds_count", endpoint="/v1/images/edits") == 1

def test_editing_not_declared_is_refused_with_the_flag(warm_app):
    backend, url = warm_app
    assert backend.settings.references == (0,)
    client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.images.edit(model="image", image=[CAT], prompt="x", extra_body={"steps": 1})
    message = caught.value.body["message"]
    assert "does not edit images" in message and "--references 0,1" in message
    assert caught.value.body["code"] == "editing_not_served"
    image = next(m for m in client.models.list() if m.model_extra["engine"] == "image")
    assert image.model_extra["edits"] == []
