"""The page in front of other servers (--chat-server, --image-server): four app processes on loopback, a chat
worker (--no-image), two image workers (--no-chat) warm for different sizes, and the page in front of them, in
headless Chromium. The visitor sees a streamed reply stopped on the page, an image made by the one worker warm for
its size with its live preview, and an image whose worker is killed mid-run finished by the other worker.
Screenshots: test-artifacts/screenshots/scaled-out-*.png."""

from __future__ import annotations

import time

import pytest
from PIL import ImageStat
from support.browser import (
    MAX_NEW_TOKENS,
    PROCESSES,
    REPLY_TIMEOUT_MS,
    TABLE_ROWS_JS,
    _bot_texts,
    _choose_size,
    _close_accordion,
    _open_accordion,
    _send,
    _set_number,
    _shot,
    _steady_picture,
    _wait_ready,
    held,
    open_page,
    running_app,
    stop_held_reply,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def servers(chromium):
    with running_app("scaled-chat-worker.log", "--no-image") as chat, \
            running_app("scaled-image-a.log", "--no-chat", "--sizes", "96x64") as image_a, \
            running_app("scaled-image-b.log", "--no-chat", "--sizes", "64x64,96x64") as image_b, \
            running_app("scaled-front.log", "--sizes", "64x64,96x64", "--chat-server", chat + "v1",
                        "--image-server", f"{image_a.rstrip('/')},{image_b.rstrip('/')}") as front:
        yield front, chat, image_a.rstrip("/"), image_b.rstrip("/")


@pytest.fixture(scope="module")
def page(browser, servers):
    context, page = open_page(browser, servers[0], "en-US")
    _wait_ready(page)
    yield page
    context.close()


def test_the_panel_names_each_server_and_its_warm_sizes(page, servers):
    _, chat, image_a, image_b = servers
    chips = page.locator("#engine-chips .chip").all_inner_texts()
    image = f"Image · demo FLUX.2-klein (tiny, random weights) · {image_a},{image_b} · ready"
    assert chips == [f"Chat · demo Qwen3 (tiny, random weights) · {chat}v1 · ready", image], chips
    _open_accordion(page, "Warm-up details")
    # The table's rows are drawn a moment after the accordion opens (read at once, under load: none yet).
    page.wait_for_function(f"() => ({TABLE_ROWS_JS})().length > 0")
    tasks = " | ".join(" ; ".join(row) for row in page.evaluate(TABLE_ROWS_JS))
    assert f"connect to {image_a}" in tasks and f"1/1 sizes ready at {image_a}" in tasks, tasks
    assert f"connect to {image_b}" in tasks and f"2/2 sizes ready at {image_b}" in tasks, tasks
    page.locator("#image-tab-button").click()
    picked = page.locator("#image-size input").input_value()
    assert picked == "64x64 (1:1) · ready", picked  # a size is ready where one worker is warm for it
    _shot(page, "scaled-out-01-panel", full_page=False)
    _close_accordion(page, "Warm-up details")


def test_a_reply_streams_from_the_chat_worker_and_stop_ends_it(page, servers):
    _, chat, _, _ = servers
    page.locator("#chat-tab-button").click()
    _open_accordion(page, "Sampling and system prompt")
    page.get_by_label("Greedy (no sampling)").check()  # greedy runs to all MAX_NEW_TOKENS words here
    with held(chat, "chat", after_steps=12) as hold_again:  # the worker waits mid-reply: the page is read meanwhile
        _send(page, "Tell me a long story about compilers.")
        page.wait_for_function("() => { const b = document.querySelectorAll('#chatbot .message-row.bot-row');"
                               " return b.length && b[b.length - 1].innerText.trim().length > 0; }",
                               timeout=REPLY_TIMEOUT_MS)
        partial = _bot_texts(page)[-1]
        _shot(page, "scaled-out-02-chat-streaming", full_page=False)
        stop_held_reply(page, page.locator("#chat-tab button.stop-button").click, hold_again)
    page.locator("#chat-stats", has_text="stopped").wait_for(timeout=REPLY_TIMEOUT_MS)
    stopped = _bot_texts(page)[-1]
    assert partial and 0 < len(stopped.split()) < MAX_NEW_TOKENS, (partial, stopped)


def _start_image(page, size: str, steps: int, prompt: str) -> None:
    page.locator("#image-tab-button").click()
    page.locator("#image-prompt textarea").fill(prompt)
    _choose_size(page, size)
    _set_number(page, "number input for Steps", steps)
    page.locator("#generate").click()


def _final_image(page, size: str) -> str:
    """Once the run's image shows: its parameters as the page's JSON view shows them (the accordion open)."""
    page.wait_for_function("() => { const l = document.querySelector('#image-out [data-testid=block-label]'),"
                           " p = document.querySelector('#image-params');"
                           " return l && l.textContent.trim() === 'Image' && p && p.innerText.includes('worker'); }",
                           timeout=REPLY_TIMEOUT_MS)
    shown = page.locator("#image-params").inner_text()
    assert size in shown, shown
    return shown


def test_an_image_comes_from_the_worker_warm_for_its_size_with_its_live_preview(page, servers):
    _, _, image_a, image_b = servers
    page.locator("#image-tab-button").click()
    _open_accordion(page, "PNG, parameters and Python")
    with held(image_b, "image", after_steps=5):  # 64x64: only the second worker is warm for it
        _start_image(page, "64x64", 40, "a red fox in the snow")
        page.locator("#image-out [data-testid=block-label]", has_text="Preview").wait_for(timeout=REPLY_TIMEOUT_MS)
        _, preview = _steady_picture(page)
        _shot(page, "scaled-out-03-image-preview", full_page=False)
    stat = ImageStat.Stat(preview.convert("L"))
    assert stat.stddev[0] > 8 and stat.mean[0] < 235, (stat.mean, stat.stddev)  # a picture, not a blank box
    shown = _final_image(page, "64x64")
    assert image_b in shown and image_a not in shown, shown
    _shot(page, "scaled-out-04-image-done", full_page=False)


def test_a_worker_killed_mid_image_gives_way_to_the_other_warm_worker(page, servers):
    _, _, image_a, image_b = servers
    page.locator("#image-tab-button").click()
    _open_accordion(page, "PNG, parameters and Python")  # where _final_image reads the worker (open already in order)
    with held(image_a, "image", after_steps=3), held(image_b, "image", after_steps=10_000):
        _start_image(page, "96x64", 20, "a lighthouse at dusk")  # both warm and idle: the first worker takes it
        page.locator("#image-out [data-testid=block-label]", has_text="Preview").wait_for(timeout=REPLY_TIMEOUT_MS)
        _shot(page, "scaled-out-05-before-kill", full_page=False)
        killed = time.monotonic()
        PROCESSES[image_a + "/"].kill()
    shown = _final_image(page, "96x64")
    took = time.monotonic() - killed
    _shot(page, "scaled-out-06-after-kill", full_page=False)
    assert image_b in shown, shown  # made again, whole, by the worker still up
    assert took < 60, took
