"""/v1's client errors in OpenAI's error object with the right 4xx, driven by the official ``openai`` SDK (loopback
only): bad message content, an unknown route, a wrong method, a body over the limit, a file name too long, an engine
the server does not run, and a full disk under ``response_format: "url"`` (507, base64 still served)."""

from __future__ import annotations

import base64
import builtins
import errno
import io
import os
from pathlib import Path

import pytest
from support.app import start_app

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(warm_app):
    backend, url = warm_app
    return backend, openai.OpenAI(base_url=url + "v1", api_key="unused: no key configured", max_retries=0)


def _error(caught) -> dict:
    body = caught.value.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}, body  # the SDK unwraps it
    assert "Traceback" not in body["message"]
    return body


@pytest.mark.parametrize(("content", "said"), [
    (None, "messages[0].content must be text or a list of text parts, got NoneType."),
    (5, "messages[0].content must be text or a list of text parts, got int."),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
     "messages[0].content has a part of type 'image_url'; only text parts are accepted."),
    ([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}],
     "messages[0].content has a part of type 'input_audio'; only text parts are accepted."),
])
def test_message_content_the_server_cannot_read_is_a_400(served, content, said):
    _, client = served
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": content}], max_tokens=2)
    error = _error(caught)
    assert error["message"] == said and error["type"] == "invalid_request_error"


def test_unknown_routes_wrong_methods_and_long_names_answer_in_openais_shape(served):
    _, client = served
    with pytest.raises(openai.NotFoundError) as caught:
        client.get("/assistants", cast_to=object)
    error = _error(caught)
    assert error["code"] == "unknown_url" and error["type"] == "not_found_error"
    assert error["message"].startswith("No route GET /v1/assistants here; /v1 serves: GET /v1/models")
    with pytest.raises(openai.APIStatusError) as caught:
        client.get("/chat/completions", cast_to=object)
    assert caught.value.status_code == 405
    error = _error(caught)
    assert error["code"] == "method_not_allowed" and error["message"] == ("GET is not allowed on /v1/chat/completions; "
                                                                          "use POST.")
    with pytest.raises(openai.NotFoundError) as caught:
        client.get("/images/files/" + "a" * 5000 + ".png", cast_to=object)
    assert _error(caught)["code"] == "file_not_found"
    assert client.get("/models", cast_to=object)["object"] == "list"  # and the routes that exist still answer


def test_error_answers_off_v1_keep_the_frameworks_shape(warm_app):
    """The error layer is entered by /v1 requests only: a 404 or 413 elsewhere is the framework's own."""
    import httpx

    backend, url = warm_app
    for path in ("no-such-page", "v1x/models"):
        answer = httpx.get(url + path, timeout=10)
        assert answer.status_code == 404 and answer.json() == {"detail": "Not Found"}, path
    answer = httpx.post(url + "gradio_api/queue/join", content=b"x" * (backend.settings.max_request_bytes + 1),
                        timeout=30)
    assert answer.status_code == 413 and "--max-request-bytes" in answer.json()["detail"]


def test_a_body_over_the_limit_is_a_413_in_openais_shape(served):
    backend, client = served
    huge = "x" * (backend.settings.max_request_bytes + 1)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": huge}], max_tokens=2)
    assert caught.value.status_code == 413
    error = _error(caught)
    assert error["code"] == "request_too_large" and "--max-request-bytes" in error["message"]


@pytest.fixture(scope="module")
def chat_only(tmp_path_factory):
    demo, backend, url = start_app(tmp_path_factory.mktemp("v1-no-image"), "--no-image")
    yield backend, openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0)
    demo.close()


def test_an_engine_the_server_does_not_run_is_a_404_not_a_wait(chat_only):
    backend, client = chat_only
    with pytest.raises(openai.NotFoundError) as caught:
        client.images.generate(model="image", prompt="a fox", size="64x64")
    error = _error(caught)
    assert error["code"] == "model_not_found" and caught.value.response.headers.get("retry-after") is None
    assert error["message"] == (f"This server runs no image model (it was started with --no-image); it serves: "
                                f"{backend.settings.chat_model}.")
    with pytest.raises(openai.NotFoundError):
        client.images.edit(model="image", prompt="x", image=("a.png", b"x"))


class FullDisk:
    """While on, every file opened for writing under ``root`` fails with ENOSPC (the disk is faked at ``open``)."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.on = str(Path(root).resolve()), False
        real_open = builtins.open

        def open_(file, mode="r", *args, **kwargs):
            if self.on and isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") \
                    and str(Path(file).resolve()).startswith(self.root):
                raise OSError(errno.ENOSPC, "No space left on device", str(file))
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", open_)
        monkeypatch.setattr(io, "open", open_)


def test_a_full_disk_is_507_for_a_url_and_base64_still_works(served, monkeypatch):
    backend, client = served
    disk = FullDisk(backend.settings.cache_dir, monkeypatch)
    disk.on = True
    with pytest.raises(openai.InternalServerError) as caught:
        client.images.generate(model="image", prompt="a lighthouse", size="64x64", response_format="url",
                               extra_body={"steps": 1, "seed": 5})
    assert caught.value.status_code == 507
    error = _error(caught)
    assert error["code"] == "insufficient_storage" and error["param"] == "response_format"
    assert "disk is full" in error["message"] and 'response_format "b64_json"' in error["message"]
    assert "No space left" not in error["message"] and str(backend.settings.cache_dir) not in error["message"]
    image = client.images.generate(model="image", prompt="a lighthouse", size="64x64", response_format="b64_json",
                                   extra_body={"steps": 1, "seed": 5})
    assert base64.b64decode(image.data[0].b64_json).startswith(b"\x89PNG")


def test_wrong_api_keys_back_off_like_failed_logins(tmp_path_factory):
    """Five wrong keys are free; the sixth locks the address out for Retry-After seconds, the right key too."""
    import time

    key = "sk-right-0123456789"
    demo, backend, url = start_app(tmp_path_factory.mktemp("v1-keys"), "--api-key", key, "--no-image")
    try:
        wrong = openai.OpenAI(base_url=url + "v1", api_key="sk-wrong", max_retries=0)
        right = openai.OpenAI(base_url=url + "v1", api_key=key, max_retries=0)
        for _ in range(6):
            with pytest.raises(openai.AuthenticationError):
                wrong.models.list()
        with pytest.raises(openai.RateLimitError) as caught:
            right.models.list()
        error = _error(caught)
        wait = int(caught.value.response.headers["retry-after"])
        assert error["code"] == "too_many_wrong_keys" and 1 <= wait <= 2
        assert error["message"] == f"Too many wrong API keys from this address: try again in {wait} s."
        time.sleep(wait)  # the server's own Retry-After: then the right key works again
        assert [m.id for m in right.models.list()] == [backend.settings.chat_model]
    finally:
        demo.close()


def test_a_first_compile_answers_503_with_the_plans_estimate_as_retry_after(tmp_path_factory):
    """Nothing learned yet (a first start): Retry-After comes from the compile plan's first-run estimate."""
    demo, backend, url = start_app(tmp_path_factory.mktemp("v1-first-compile"), "--no-chat", "--sizes", "64x64",
                                   warm=False)
    try:
        task = backend.runner._steps[-1].task  # the engine's only size, its first compile, left queued
        assert task.kind == "compile" and task.shape == "64x64"
        task.expected_s, task.estimate_s = None, 150.0  # a first start: no history, the plan's estimate
        client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.images.generate(model="image", prompt="x", size="64x64")
        assert caught.value.status_code == 503 and _error(caught)["code"] == "shape_not_ready"
        assert caught.value.response.headers.get("retry-after") == "150"
    finally:
        demo.close()


@pytest.mark.parametrize("n", [1.0, True, "1"])
def test_n_is_the_whole_number_1_not_a_float_or_a_bool(served, n):
    _, client = served
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       extra_body={"n": n})
    assert _error(caught)["param"] == "n" and "n must be the whole number 1" in _error(caught)["message"]


def test_a_local_model_folder_is_named_by_its_folder_never_its_server_path(tmp_path):
    from types import SimpleNamespace

    from tools.openai_api.schema import model_names

    backend = SimpleNamespace(settings=SimpleNamespace(chat_model="/srv/models/Qwen3-0.6B",
                                                       image_model="Qwen/FLUX.2-klein-4B"))
    assert model_names(backend, "chat") == ("Qwen3-0.6B", "chat")
    assert model_names(backend, "image") == ("Qwen/FLUX.2-klein-4B", "image")  # a hub id stays as it is
    backend.settings.chat_model = "./models/qwen-local/"
    assert model_names(backend, "chat") == ("qwen-local", "chat")


def test_reference_names_lose_control_bidi_and_html_characters():
    from neuron_backend.image.references import clean_name

    assert clean_name("cat\x00\u202egnp.exe<script>.png") == "catgnp.exe_script_.png"
    assert clean_name("\u2066\u2069") is None and clean_name(None) is None
    assert clean_name("a" * 500) == "a" * 200
    assert clean_name("قطة.png") == "قطة.png"  # letters of any script stay
