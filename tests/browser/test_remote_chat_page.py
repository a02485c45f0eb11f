"""The Chat tab of a page whose chat runs on another server (--chat-server): two app processes on loopback, a
chat worker (--no-image) and the page in front of it, in headless Chromium. The visitor sees where the chat runs,
the reply streams into view while the worker still generates it, Stop cuts it short on the page and frees the
worker. Screenshots: test-artifacts/screenshots/remote-chat-*.png."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest
from support.browser import (
    MAX_NEW_TOKENS,
    REPLY_TIMEOUT_MS,
    WATCH_CHAT_JS,
    _bot_texts,
    _open_accordion,
    _send,
    _shot,
    _wait_ready,
    held,
    open_page,
    running_app,
    stop_held_reply,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def worker_and_front(chromium):
    with running_app("remote-chat-worker.log", "--no-image") as worker, \
            running_app("remote-chat-front.log", "--no-image", "--chat-server", worker + "v1") as front:
        yield worker, front


def _worker_busy(worker: str) -> bool:
    """Whether the worker still runs a chat reply, as its operator sees it: its /metrics in-progress gauge."""
    with urllib.request.urlopen(worker + "metrics", timeout=5) as answer:  # noqa: S310 - loopback only
        text = answer.read().decode()
    match = re.search(r'^showcase_requests_in_progress\{endpoint="chat"\} (\S+)$', text, re.MULTILINE)
    assert match, "the worker's /metrics has no chat in-progress gauge"
    return float(match.group(1)) > 0


def test_the_reply_streams_from_the_chat_server_and_stop_frees_it(browser, worker_and_front):
    worker, front = worker_and_front
    context, page = open_page(browser, front, "en-US")
    try:
        _wait_ready(page)
        chips = page.locator("#engine-chips .chip").all_inner_texts()
        assert chips == [f"Chat · demo Qwen3 (tiny, random weights) · {worker}v1 · ready"], chips  # as it says
        page.locator("#chat-tab-button").click()
        _open_accordion(page, "Sampling and system prompt")
        page.get_by_label("Greedy (no sampling)").check()  # greedy runs to all MAX_NEW_TOKENS words here
        page.evaluate(WATCH_CHAT_JS)
        with held(worker, "chat", after_steps=12) as hold_again:  # the worker waits mid-reply: the page is read
            _send(page, "Tell me a long story about compilers.")
            page.wait_for_function("() => window.__replies.length >= 2", timeout=REPLY_TIMEOUT_MS)
            page.locator("#chatbot .message-row.bot-row").last.scroll_into_view_if_needed()
            shot = _shot(page, "remote-chat-streaming", full_page=False)
            partial = _bot_texts(page)[-1]
            box = page.locator("#chatbot .message-row.bot-row").last.bounding_box()
            assert partial and box and 0 <= box["y"] < page.viewport_size["height"], (partial, box, shot)
            assert page.locator("#chat-tab button.stop-button").is_visible()
            stop_held_reply(page, page.locator("#chat-tab button.stop-button").click, hold_again)
        # The worker goes on once released; at its next token the page's reply ends, stopped.
        page.locator("#chat-stats", has_text="stopped").wait_for(timeout=REPLY_TIMEOUT_MS)
        stopped = _bot_texts(page)[-1]
        assert 0 < len(stopped.split()) < MAX_NEW_TOKENS and stopped.startswith(partial.split("\n")[0][:20])
        meter = page.locator("#context-meter").inner_text()
        assert "new tokens on the chat server" in meter, meter  # a stopped stream ends before the server counts
        _shot(page, "remote-chat-stopped", full_page=False)
        deadline = time.monotonic() + 10
        while _worker_busy(worker) and time.monotonic() < deadline:  # it hears the closed stream within a token
            time.sleep(0.1)
        assert not _worker_busy(worker), "the worker still generates the reply the page stopped"
    finally:
        context.close()
