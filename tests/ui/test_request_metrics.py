"""What users wait for, scraped from ``/metrics`` of a running app after real gradio_client calls: the
end-to-end time from joining Gradio's queue, the queue wait, refusals by reason, image steps per second;
and the clock of the tabs' handlers on its own, started when Gradio's queue says the event joined (the queue-join
refusals counted by the core's edge: tests/ui/test_guards.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest
from gradio.context import LocalContext
from gradio_client import Client
from prometheus_client.parser import text_string_to_metric_families
from support.app import SIZES

from neuron_backend.errors import CancelledError, UnsupportedSizeError
from neuron_backend.metrics import Metrics, RequestClock, measured
from ui.api import queued_at

SIZE = SIZES.split(",")[0]


def scrape(source) -> dict[tuple[str, tuple], float]:
    """Every sample of one scrape of a URL (or a Metrics), keyed by (name, sorted labels); the text must parse."""
    text = httpx.get(source + "metrics").text if isinstance(source, str) else source.exposition().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def grew(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


E2E, WAIT = "showcase_request_duration_seconds", "showcase_queue_wait_seconds"


@pytest.mark.slow
def test_a_chat_an_image_and_a_refusal_feed_the_end_to_end_metrics(warm_app):
    backend, url = warm_app
    client = Client(url, verbose=False)
    before = scrape(url)
    start = time.monotonic()
    update = list(client.submit(message="Hello", max_new_tokens=8, greedy=True, api_name="/chat"))[-1]
    chat_wall = time.monotonic() - start
    client.predict(prompt="a lighthouse", size=SIZE, steps=2, seed=3, guidance=None, api_name="/generate_image")
    with pytest.raises(Exception, match="Allowed sizes"):
        client.predict(prompt="a lighthouse", size="512x512", steps=2, seed=3, guidance=None,
                       api_name="/generate_image")
    after = scrape(url)

    assert grew(before, after, E2E + "_count", endpoint="/chat") == 1
    assert grew(before, after, WAIT + "_count", endpoint="/chat") == 1
    chat_e2e = grew(before, after, E2E + "_sum", endpoint="/chat")
    assert update["stats"]["total_s"] <= chat_e2e <= chat_wall  # the handler's time inside, the client's outside
    assert grew(before, after, WAIT + "_sum", endpoint="/chat") <= chat_e2e
    assert grew(before, after, E2E + "_count", endpoint="/generate_image") == 2  # the refusal waited too
    assert grew(before, after, "showcase_refusals_total", endpoint="/generate_image", reason="bad_input") == 1
    assert sum(grew(before, after, "showcase_refusals_total", endpoint="/generate_image", reason=reason)
               for reason in ("busy", "not_ready", "failed_shape", "auth", "other")) == 0
    assert grew(before, after, "showcase_image_steps_per_second_count", size=SIZE) == 1
    steps_per_s = grew(before, after, "showcase_image_steps_per_second_sum", size=SIZE)
    assert steps_per_s == pytest.approx(2 / grew(before, after, "showcase_image_seconds_sum", size=SIZE), rel=1e-6)
    assert grew(before, after, E2E + "_sum", endpoint="/generate_image") >= grew(
        before, after, "showcase_image_seconds_sum", size=SIZE)
    info = [dict(labels) for (name, labels), v in after.items() if name == "showcase_build_info" and v == 1]
    assert len(info) == 1 and info[0]["device"] == "cpu" and info[0]["chat_model"].startswith("demo Qwen3")


@pytest.mark.slow
def test_the_queue_wait_is_counted_from_joining_the_queue_not_from_generate(warm_app):
    """One reply holds the device's queue slot while the chat engine is busy; the next waits in Gradio's
    queue. TTFT (from generate()) stays small; the end-to-end time and the queue wait show the wait."""
    backend, url = warm_app
    client = Client(url, verbose=False)
    before = scrape(url)
    jobs, held_s = [], 1.5
    with backend.engine("chat").jobs.job():  # the engine is busy: the first reply's handler waits for it
        first = client.submit(message="one", max_new_tokens=4, greedy=True, api_name="/chat")
        _wait_for(lambda: backend.metrics.in_progress.labels("chat")._value.get() >= 1)
        second = client.submit(message="two", max_new_tokens=4, greedy=True, api_name="/chat")
        _wait_for(lambda: backend.metrics.queue_depth() >= 1)  # the second waits in Gradio's queue
        jobs += [first, second]
        time.sleep(held_s)
    for job in jobs:
        assert job.result(timeout=60)["done"]
    after = scrape(url)
    assert grew(before, after, WAIT + "_count", endpoint="/chat") == 2
    assert grew(before, after, WAIT + "_sum", endpoint="/chat") >= 0.8 * held_s
    e2e = grew(before, after, E2E + "_sum", endpoint="/chat")
    ttft = grew(before, after, "showcase_chat_time_to_first_token_seconds_sum")
    assert e2e >= 2 * 0.8 * held_s and ttft < e2e / 2  # what a TTFT-only dashboard missed


def _wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ----- the handlers' clock, with Gradio's context as the queue sets it ------------------------------------
def _queued_event(seconds_ago: float):
    """Gradio's context around a handler of an event that joined the queue ``seconds_ago``."""
    event = SimpleNamespace(enqueue_time=time.monotonic() - seconds_ago)
    blocks = SimpleNamespace(_queue=SimpleNamespace(event_ids_to_events={"e1": event}))
    return LocalContext.blocks.set(blocks), LocalContext.event_id.set("e1")


def _leave(tokens) -> None:
    LocalContext.blocks.reset(tokens[0])
    LocalContext.event_id.reset(tokens[1])


def test_the_chat_tab_clock_starts_when_its_event_joined_the_queue():
    metrics = Metrics()

    @measured(metrics, "chat_tab", queued_at)
    def send_message():
        time.sleep(0.05)
        yield "reply"

    tokens = _queued_event(3.0)
    try:
        assert list(send_message()) == ["reply"]
    finally:
        _leave(tokens)
    samples = scrape(metrics)
    wait = samples[(WAIT + "_sum", (("endpoint", "chat_tab"),))]
    e2e = samples[(E2E + "_sum", (("endpoint", "chat_tab"),))]
    assert 3.0 <= wait < 3.5 and e2e >= wait + 0.05
    assert list(send_message()) == ["reply"]  # outside the queue: timed from its first line
    assert scrape(metrics)[(E2E + "_count", (("endpoint", "chat_tab"),))] == 2


def test_the_image_tab_request_ends_when_its_images_are_shown_or_it_is_refused():
    metrics = Metrics()
    tab = (("endpoint", "image_tab"),)

    @measured(metrics, "image_tab", queued_at, ends=False)
    async def press_generate(refuse: Exception | None = None):
        if refuse is not None:
            raise refuse
        yield "progress"

    async def drain(gen):
        return [item async for item in gen]

    tokens = _queued_event(2.0)
    try:
        assert asyncio.run(drain(press_generate())) == ["progress"]
        assert scrape(metrics)[(E2E + "_count", tab)] == 0  # the run goes on: show_images ends it
        clock = RequestClock(metrics, "image_tab", since=time.monotonic() - 2.5, waited=False)  # show_images
        clock.finish()
        clock.finish()  # once only
        with pytest.raises(UnsupportedSizeError):
            asyncio.run(drain(press_generate(UnsupportedSizeError("Allowed sizes: 64x64"))))
        with pytest.raises(CancelledError):
            asyncio.run(drain(press_generate(CancelledError("stopped"))))
    finally:
        _leave(tokens)
    samples = scrape(metrics)
    assert samples[(WAIT + "_count", tab)] == 3  # each press_generate; show_images waited in no queue
    assert samples[(E2E + "_count", tab)] == 3 and samples[(E2E + "_sum", tab)] >= 2.5 + 2 * 2.0
    assert samples[("showcase_refusals_total", (*tab, ("reason", "bad_input")))] == 1
    assert sum(v for (name, labels), v in samples.items() if name == "showcase_refusals_total") == 1  # no cancel
