"""The two tabs in the metrics: a message sent in the Chat tab and an image made in the Image tab each
count once in the end-to-end histogram and the queue wait, measured in the app process that served them.

Runs on the session's app process (tests/browser/conftest.py) with the module's page.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from support.browser import SIZES, _bot_texts, _generate, _send, _wait_ready, _wait_reply


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _grew(before: dict, after: dict, name: str, endpoint: str) -> float:
    key = (name, (("endpoint", endpoint),))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_the_chat_and_image_tabs_feed_the_end_to_end_metrics(page, app_url):
    _wait_ready(page)
    before = _scrape(app_url)
    page.locator("#chat-tab-button").click()
    bots = len(_bot_texts(page))
    _send(page, "Hello there")
    _wait_reply(page, bots + 1)
    page.wait_for_function("() => !document.querySelector('#chat-tab textarea').disabled")  # the reply ended
    page.locator("#image-tab-button").click()
    _generate(page, "a lighthouse", SIZES[0], steps=2)
    after = _scrape(app_url)
    for endpoint in ("chat_tab", "image_tab"):
        assert _grew(before, after, "showcase_request_duration_seconds_count", endpoint) == 1, endpoint
        assert _grew(before, after, "showcase_queue_wait_seconds_count", endpoint) == 1, endpoint
        assert _grew(before, after, "showcase_request_duration_seconds_sum", endpoint) >= _grew(
            before, after, "showcase_queue_wait_seconds_sum", endpoint)
    image_run = _grew(before, after, "showcase_request_duration_seconds_sum", "image_tab")
    made = after[("showcase_image_seconds_sum", (("size", SIZES[0]),))] - before.get(
        ("showcase_image_seconds_sum", (("size", SIZES[0]),)), 0.0)
    assert image_run >= made > 0  # the tab's run spans the generation and the showing of its images
