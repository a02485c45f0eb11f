"""The OpenAI-compatible /v1 routes, driven by the official ``openai`` SDK against the app on the tiny models
(loopback only): chat streamed and not, thinking, stop sequences, a cancelled stream, images, the typed
errors (400, 401, 404, 429, 503) and the /v1 metrics."""

from __future__ import annotations

import base64
import io
import re
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from PIL import Image
from support.app import slowed, start_app

from neuron_backend.chat.text import ChatStats, ChatUpdate

openai = pytest.importorskip("openai")

KEY = "sk-test-0123456789"
HELLO = [{"role": "user", "content": "hello"}]


def _metric(text: str, name: str, **labels) -> float:
    """One sample of the Prometheus text (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{re.escape(name)}(?:\{{{re.escape(wanted)}\}})? (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def served(warm_app):
    backend, url = warm_app
    return backend, openai.OpenAI(base_url=url + "v1", api_key="unused: no key configured", max_retries=0)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """--auth with an API key, one waiting request at most, and the last image size still compiling."""
    demo, backend, url = start_app(tmp_path_factory.mktemp("v1-guarded"), "--auth", "ada:lovelace", "--api-key", KEY,
                                   "--queue-size", "1", warm=False)
    yield backend, url
    demo.close()


def _chat(client, **kwargs):
    return client.chat.completions.create(model="chat", messages=kwargs.pop("messages", HELLO), **kwargs)


# ----- models and chat ----------------------------------------------------------------------------
def test_models_list_the_served_models_with_their_declared_shapes(served):
    backend, client = served
    models = {m.id: m.model_extra for m in client.models.list()}
    chat, image = models[backend.settings.chat_model], models[backend.settings.image_model]
    assert chat["engine"] == "chat" and chat["buckets"] == [32, 64, 128] and chat["context_length"] == 256
    assert chat["demo"] is True and chat["state"] == "ready" and set(chat["shapes"]) == {"prefill-32", "prefill-64",
                                                                                          "prefill-128"}
    assert image["sizes"] == ["64x64", "96x64"] and image["max_steps"] == 50
    assert client.models.retrieve(backend.settings.chat_model).id == backend.settings.chat_model
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4o")


def test_chat_streamed_and_not_give_the_same_greedy_reply_with_usage(served):
    _, client = served
    whole = _chat(client, max_tokens=24, temperature=0)
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length") and choice.message.model_extra["reasoning_content"] is None
    assert whole.usage.completion_tokens <= 24 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    chunks = list(_chat(client, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_thinking_on_and_off_through_chat_template_kwargs(served):
    """Thinking off closes an empty think block in the prompt (Qwen3's template): more prompt tokens."""
    _, client = served
    replies = {on: _chat(client, max_tokens=4, temperature=0, extra_body={"chat_template_kwargs":
                                                                          {"enable_thinking": on}})
               for on in (True, False)}
    assert replies[False].usage.prompt_tokens > replies[True].usage.prompt_tokens
    assert all("reasoning_content" in r.choices[0].message.model_extra for r in replies.values())
    streamed = list(_chat(client, max_tokens=4, temperature=0, stream=True,
                          extra_body={"chat_template_kwargs": {"enable_thinking": True}}))
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")


def test_reasoning_comes_apart_from_the_answer():
    """The demo model never writes <think> (its vocabulary has none), so the split is checked on updates."""
    from tools.openai_api.schema import ReplyText, StopScan

    stats = ChatStats(9, 32, 7, 0.01, 10.0, 0.1, 0, 0, 256, 64, False, "eos")
    text = ReplyText(StopScan(("END",)))
    steps = [ChatUpdate("weigh", "", "weigh", False), ChatUpdate("weighing", "", "ing", False),
             ChatUpdate("weighing", "The ans", "The ans", False), ChatUpdate("weighing", "The answer. EN", "wer. EN",
                                                                              False),
             ChatUpdate("weighing", "The answer. END more", "D more", True, stats)]
    deltas = [text.feed(update) for update in steps]
    assert deltas == [("weigh", ""), ("ing", ""), ("", "The ans"), ("", "wer. "), ("", "")]
    assert (text.reasoning, text.answer, text.finish_reason) == ("weighing", "The answer. ", "stop")
    assert text.usage() == {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}


def test_a_stop_sequence_ends_the_reply_where_it_begins(served):
    _, client = served
    whole = _chat(client, max_tokens=40, temperature=0)
    full = whole.choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 4]
    expected = full[: full.index(stop)]
    cut = _chat(client, max_tokens=40, temperature=0, stop=[stop, "never-in-this-reply"])
    assert cut.choices[0].message.content == expected and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < whole.usage.completion_tokens  # the engine stopped there too
    streamed = list(_chat(client, max_tokens=40, temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_stop_sequences_keep_to_openais_limits_said_in_the_400(served):
    """At most 4, each at most 256 characters: four of 40,000 (a 160 KB request) once cost a minute of scanning."""
    _, client = served
    with pytest.raises(openai.BadRequestError) as refused:
        _chat(client, max_tokens=4, stop=["x" * 40_000] * 4)
    said = refused.value.body
    assert said["param"] == "stop" and said["type"] == "invalid_request_error"
    assert said["message"] == ("stop must be a text or a list of up to 4 non-empty texts of at most 256 characters "
                               "each; one has 40000 characters.")
    with pytest.raises(openai.BadRequestError, match="up to 4 non-empty texts .*; got a list of 5"):
        _chat(client, max_tokens=4, stop=["a", "b", "c", "d", "e"])
    assert _chat(client, max_tokens=4, stop=["x" * 256] * 4).choices[0].finish_reason in ("stop", "length")


def test_the_stop_scan_finds_the_first_stop_to_complete_however_the_reply_streams():
    """Against a plain search of the whole text, for texts, stops and update boundaries drawn at random."""
    import random

    from tools.openai_api.schema import StopScan

    rng = random.Random(52)
    for _ in range(400):
        text = "".join(rng.choice("aab") for _ in range(rng.randrange(0, 60)))
        stops = tuple("".join(rng.choice("ab") for _ in range(rng.randrange(1, 6))) for _ in range(rng.randrange(1, 5)))
        ends = [(at + len(s), at) for s in stops if (at := text.find(s)) >= 0]
        first = min(text.find(s) + len(s) for s in stops if s in text) if ends else None
        expected = text if first is None else text[:min(at for end, at in ends if end == first)]
        scan, sent, cuts = StopScan(stops), "", sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 5)))
        for cut in [*cuts, len(text)]:
            sent += scan.feed(text[:cut])
            assert expected.startswith(sent), (text, stops, sent)
        sent += scan.feed(text, final=True)
        assert sent == expected and scan.hit == (first is not None), (text, stops, sent, expected)


def test_a_cancelled_stream_frees_the_engine(served):
    backend, client = served
    engine, url = backend.engine("chat"), str(client.base_url).removesuffix("v1/")
    cancelled = _metric(httpx.get(url + "metrics").text, "showcase_requests_total", endpoint="chat",
                        outcome="cancelled")
    with slowed(engine):
        stream = _chat(client, max_tokens=200, temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks), next(chunks)  # the role chunk, then the first text
        assert engine.busy
        stream.close()
        deadline = time.time() + 5
        while engine.busy and time.time() < deadline:
            time.sleep(0.02)
    assert not engine.busy
    after = _metric(httpx.get(url + "metrics").text, "showcase_requests_total", endpoint="chat", outcome="cancelled")
    assert after == cancelled + 1  # stopped early, not run to its 200 tokens
    assert _chat(client, max_tokens=3).choices[0].message.content is not None


# ----- images -------------------------------------------------------------------------------------
def test_image_as_b64_json_decodes_to_the_requested_size_with_its_parameters(served):
    _, client = served
    result = client.images.generate(model="image", prompt="a lighthouse", size="96x64", n=2,
                                    response_format="b64_json", extra_body={"seed": 11, "steps": 2})
    assert len(result.data) == 2
    for i, item in enumerate(result.data):
        with Image.open(io.BytesIO(base64.b64decode(item.b64_json))) as image:
            assert image.size == (96, 64) and image.format == "PNG"
            assert f"Seed: {11 + i}" in image.text["parameters"] and "a lighthouse" in image.text["parameters"]
        assert item.model_extra["parameters"]["steps"] == 2


def test_image_by_url_is_served_from_the_outputs_folder(served):
    _, client = served
    item = client.images.generate(model="image", prompt="a lighthouse", size="64x64", response_format="url",
                                  extra_body={"seed": 5, "steps": 1}).data[0]
    answer = httpx.get(item.url)
    assert answer.status_code == 200 and answer.headers["content-type"] == "image/png"
    with Image.open(io.BytesIO(answer.content)) as image:
        assert image.size == (64, 64) and "Seed: 5" in image.text["parameters"]
    assert httpx.get(item.url.rsplit("/", 1)[0] + "/..%2Fsecret.png").status_code == 404


# ----- errors -------------------------------------------------------------------------------------
def test_bad_requests_are_400_with_the_allowed_values(served):
    _, client = served
    with pytest.raises(openai.BadRequestError, match=r"allowed sizes: 64x64, 96x64") as info:
        client.images.generate(model="image", prompt="x", size="512x512")
    assert info.value.body["param"] == "size" and info.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="n must be the whole number 1"):
        _chat(client, n=2)
    with pytest.raises(openai.BadRequestError, match="from 1 to 200"):
        _chat(client, max_tokens=999)
    with pytest.raises(openai.BadRequestError, match="from 0.01 to 2"):
        _chat(client, temperature=5)
    with pytest.raises(openai.BadRequestError, match="ending with a user message"):
        _chat(client, messages=[{"role": "assistant", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="logprobs is accepted only as false"):
        _chat(client, logprobs=True)
    with pytest.raises(openai.NotFoundError, match="use one of"):
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert _chat(client, max_tokens=2, frequency_penalty=0, logprobs=False, user="ada").choices  # neutral: served


def test_the_v1_series_join_the_backends_registry_once_with_zeros_before_the_first_request():
    from neuron_backend.metrics import Metrics
    from tools.openai_api.metrics import v1_metrics

    metrics = Metrics()
    assert v1_metrics(metrics) is v1_metrics(metrics)  # routes built twice for one Backend register once
    text = metrics.exposition().decode()
    assert 'showcase_request_duration_seconds_count{endpoint="/v1/chat/completions"} 0.0' in text
    assert 'showcase_v1_tokens_total{kind="prompt"} 0.0' in text


def test_metrics_count_v1_requests_tokens_and_errors(served):
    backend, client = served
    url = str(client.base_url).removesuffix("v1/")
    before = httpx.get(url + "metrics").text
    usage = _chat(client, max_tokens=3).usage
    with pytest.raises(openai.BadRequestError):
        _chat(client, n=3)
    after = httpx.get(url + "metrics").text

    def grew(name, **labels):
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    assert grew("showcase_v1_requests_total", route="chat", status="200") == 1
    assert grew("showcase_v1_requests_total", route="chat", status="400") == 1
    assert grew("showcase_v1_errors_total", route="chat", type="invalid_request_error") == 1
    assert grew("showcase_v1_tokens_total", kind="completion") == usage.completion_tokens
    assert grew("showcase_v1_tokens_total", kind="prompt") == usage.prompt_tokens


@pytest.mark.slow
def test_v1_end_to_end_time_ends_at_the_last_byte_and_refusals_count_by_reason(served):
    backend, client = served
    engine, url, path = backend.engine("chat"), str(client.base_url).removesuffix("v1/"), "/v1/chat/completions"
    before = httpx.get(url + "metrics").text
    start = time.monotonic()
    with slowed(engine):
        chunks = iter(_chat(client, max_tokens=60, temperature=0, stream=True))
        next(chunks), next(chunks)  # the role chunk, then the first text
        assert engine.busy
        during = httpx.get(url + "metrics").text
        rest = list(chunks)
    wall = time.monotonic() - start
    assert rest and _metric(during, "showcase_request_duration_seconds_count", endpoint=path) == _metric(
        before, "showcase_request_duration_seconds_count", endpoint=path)  # still streaming: not ended yet
    with pytest.raises(openai.BadRequestError):
        _chat(client, n=3)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    after = httpx.get(url + "metrics").text

    def grew(name, **labels):
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    assert grew("showcase_request_duration_seconds_count", endpoint=path) == 3
    assert grew("showcase_request_duration_seconds_sum", endpoint=path) >= 0.02 * len(rest)  # the whole stream
    assert grew("showcase_request_duration_seconds_sum", endpoint=path) <= wall + 5
    assert grew("showcase_refusals_total", endpoint=path, reason="bad_input") == 2
    assert grew("showcase_refusals_total", endpoint=path, reason="busy") == 0


@pytest.mark.slow
def test_a_full_queue_is_429(guarded):
    backend, url = guarded
    client = openai.OpenAI(base_url=url + "v1", api_key=KEY, max_retries=0)
    engine, replies = backend.engine("chat"), []
    with engine.jobs.job():  # the engine is busy: the next replies wait for it
        waiting = [threading.Thread(target=lambda: replies.append(_chat(client, max_tokens=2))) for _ in range(2)]
        for thread in waiting:  # one would run (the engine's slot), one waits (--queue-size 1)
            thread.start()
        deadline = time.time() + 10
        while backend.metrics.in_progress.labels("chat")._value.get() < 2 and time.time() < deadline:
            time.sleep(0.02)
        with pytest.raises(openai.RateLimitError, match="busy"):
            _chat(client, max_tokens=2)
    for thread in waiting:
        thread.join(30)
    assert len(replies) == 2 and all(r.choices[0].finish_reason for r in replies)


@pytest.mark.slow
def test_a_size_still_compiling_is_503_with_its_eta_as_retry_after(guarded):
    _, url = guarded
    client = openai.OpenAI(base_url=url + "v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.InternalServerError, match="96x64 is still warming up") as info:
        client.images.generate(model="image", prompt="x", size="96x64")
    assert info.value.status_code == 503 and info.value.response.headers["retry-after"] == "30"
    assert info.value.body["code"] == "shape_not_ready"
    item = client.images.generate(model="image", prompt="x", size="64x64", extra_body={"steps": 1}).data[0]
    assert Image.open(io.BytesIO(base64.b64decode(item.b64_json))).size == (64, 64)


@pytest.mark.slow
def test_auth_asks_for_the_api_key(guarded):
    _, url = guarded
    for key in ("wrong", "ada:lovelace"):
        with pytest.raises(openai.AuthenticationError, match="API key"):
            openai.OpenAI(base_url=url + "v1", api_key=key, max_retries=0).models.list()
    assert httpx.get(url + "v1/models").status_code == 401
    assert openai.OpenAI(base_url=url + "v1", api_key=KEY, max_retries=0).models.list().data


def test_the_auth_rule_without_a_key():
    """No key: open without --auth (the app binds 127.0.0.1 by default), closed with it, naming the flag."""
    from starlette.requests import Request

    from tools.login.throttle import LoginThrottle
    from tools.openai_api.routes import _authorized
    from tools.openai_api.schema import ApiError

    def request(authorization=None):
        headers = [(b"authorization", authorization.encode())] if authorization else []
        return Request({"type": "http", "method": "GET", "path": "/v1/models", "headers": headers})

    throttle = LoginThrottle()
    _authorized(request(), SimpleNamespace(auth=None), None, throttle)
    with pytest.raises(ApiError, match="--api-key") as info:
        _authorized(request("Bearer anything"), SimpleNamespace(auth=("ada", "lovelace")), None, throttle)
    assert info.value.status == 401
    _authorized(request(f"Bearer {KEY}"), SimpleNamespace(auth=None), KEY, throttle)
    with pytest.raises(ApiError):
        _authorized(request(f"Basic {KEY}"), SimpleNamespace(auth=None), KEY, throttle)
