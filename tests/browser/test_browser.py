"""Proof in a real browser: a visit to the app on the tiny demo models, driven by headless Chromium.

This module starts its own app process and one browser page follows it from the first second of
warm-up, so the tests run in file order and build on each other's page state (warm-up -> chat ->
image -> hostile text -> two tabs). Every wait is on a condition in the page, never a sleep.

Screenshots of every tab land in ``test-artifacts/screenshots/`` (git-ignored) on every run. The README's
``assets/screenshot.png`` comes from test_readme_screenshot.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from PIL import Image, ImageChops, ImageStat
from support.browser import (
    BAR_BLINKS_JS,
    BAR_SEEN_IN_JS,
    BARS_OVER_JS,
    HOSTILE,
    MAX_NEW_TOKENS,
    PROGRESS_STEPS,
    READY_TIMEOUT_MS,
    REPLY_TIMEOUT_MS,
    SHORT_REPLY,
    SIZES,
    SLOW_SIZE,
    TABLE_ROWS_JS,
    WATCH_CHAT_JS,
    _bot_texts,
    _choose_size,
    _close_accordion,
    _generate,
    _message_box,
    _open_accordion,
    _retry,
    _seed_box,
    _send,
    _set_number,
    _short_replies,
    _shot,
    _size_options,
    _steady_picture,
    _table_states,
    _user_texts,
    _wait_image_sizes_ready,
    _wait_ready,
    _wait_reply,
    held,
    release,
    running_app,
    stop_held_image,
    stop_held_reply,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def app_url(chromium) -> str:
    """This module's own app process: the first test watches its warm-up from the first second."""
    with running_app(hold=(f"size-{SLOW_SIZE}",)) as url:
        yield url


# ----- scenarios --------------------------------------------------------------------------------
def test_page_loads_and_warm_up_goes_from_compiling_to_ready(page):
    # A first visitor's view: a title and a sentence, one chip per engine, the demo notice.
    header = page.locator("#page-header")
    assert header.locator("h1").inner_text() == "Hugging Face models on AWS Trainium"
    assert "Qwen3-0.6B" in header.locator(".summary").inner_text()
    chips = page.locator("#engine-chips .chip").all_inner_texts()
    assert [c.split(" · ")[:3] for c in chips] == [["Chat", "demo Qwen3 (tiny)", "cpu"],
                                                   ["Image", "demo FLUX.2-klein (tiny)", "cpu"]], chips
    notice = page.locator("#demo-notice")
    assert "noise" in notice.inner_text() and "--models tiny" in notice.inner_text()
    # coloured; read from the live element: the header is redrawn while warming up, and a replaced element's
    # computed style reads empty
    page.wait_for_function("() => { const e = document.querySelector('#demo-notice');"
                           " return e !== null && getComputedStyle(e).backgroundColor === 'rgb(255, 243, 205)'; }")
    state = page.locator("#warmup-state").inner_text()
    assert state.startswith("Warming up"), f"the page should open during warm-up, it says {state!r}"

    _open_accordion(page, "Warm-up details")  # what runs where: one click away
    details = page.locator("#warmup-details-text")
    for part in ("CPU", "chat: demo Qwen3 (tiny, random weights) on cpu",
                 "image: demo FLUX.2-klein (tiny, random weights) on cpu"):
        details.get_by_text(part, exact=False).first.wait_for()
    page.wait_for_function(f"() => ({TABLE_ROWS_JS})().length >= 10")
    early = _table_states(page)
    assert any("ready" not in s for s in early.values()), f"nothing left to warm up when the page opened: {early}"
    _shot(page, "01-warmup-compiling")
    bar_width = page.locator("#warmup-progress").bounding_box()["width"]

    # A size that is still compiling is offered as such, and refused with its message.
    page.wait_for_function(f"""() => {{
        const states = Object.fromEntries(({TABLE_ROWS_JS})().map(r => [r[0], r[2]]));
        return (states['image · size 64x64'] || '').includes('ready');
    }}""", timeout=READY_TIMEOUT_MS)
    page.locator("#image-tab-button").click()
    page.locator("#image-prompt textarea").fill("a lighthouse at dusk")
    label = _choose_size(page, SLOW_SIZE)
    assert re.search(r"· (queued|compiling)(, ~.*)?$", label), \
        f"warm-up of {SLOW_SIZE} ended before the page could ask for it (label {label!r}); the test needs a slower size"
    page.locator("#generate").click()
    toast = page.get_by_test_id("toast-body").filter(has_text=f"{SLOW_SIZE} is still warming up")
    toast.wait_for()
    assert "try again" in toast.inner_text()
    _shot(page, "02-image-size-refused")
    release(page.url, f"size-{SLOW_SIZE}")  # its warm-up goes on
    page.evaluate("document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click())")

    _wait_ready(page)
    page.wait_for_function(f"() => ({TABLE_ROWS_JS})().every(r => r[2].includes('ready'))")
    assert all(s.startswith("✅ ready") for s in _table_states(page).values()), _table_states(page)
    page.wait_for_function("() => [...document.querySelectorAll('#engine-chips .chip')].every(c => "
                           "c.dataset.state === 'ready')")
    assert page.locator(".recompile-alarm").count() == 0
    assert page.locator("#status-bar .recompile-quiet").inner_text() == "no recompiles"
    _shot(page, "03-warmup-ready")
    # the bar kept its length while the line beside it went from "Warming up: ..." to "Warm-up done in ..."
    assert abs(page.locator("#warmup-progress").bounding_box()["width"] - bar_width) < 1, bar_width


def test_chat_streams_stops_retries_and_undoes(page):
    _wait_ready(page)
    page.locator("#chat-tab-button").click()
    _open_accordion(page, "Sampling and system prompt")
    page.get_by_label("Greedy (no sampling)").check()  # greedy runs to all MAX_NEW_TOKENS words here
    page.evaluate("window.__replies = []")
    with held(page.url, "chat", after_steps=12) as hold_again:  # Stop lands mid-reply, however slow the page
        _send(page, "Tell me a long story about compilers.")
        page.locator("#chat-tab button.stop-button").wait_for()
        page.wait_for_function("() => window.__replies.length >= 2", timeout=REPLY_TIMEOUT_MS)
        stop_held_reply(page, page.locator("#chat-tab button.stop-button").click, hold_again)
    page.locator("#chat-tab button.stop-button").wait_for(state="hidden")
    streamed = page.evaluate("window.__replies")
    assert len(streamed) >= 2 and len(streamed[0]) < len(streamed[-1]), f"the reply did not stream: {streamed}"
    stopped = _bot_texts(page)[-1]
    assert 0 < len(stopped.split()) < MAX_NEW_TOKENS, "stop did not cut the reply short"
    # The stopped reply keeps its stats line, marked stopped.
    page.locator("#chat-stats", has_text="stopped").wait_for(timeout=REPLY_TIMEOUT_MS)
    assert "tokens/s" in page.locator("#chat-stats").inner_text()

    # Retry: the same question, a fresh (sampled, short) answer in place of the stopped one.
    page.get_by_label("Greedy (no sampling)").uncheck()
    _short_replies(page)
    assert _seed_box(page).input_value() == "-1"  # random: a retry must not repeat the last answer
    _retry(page)
    retried = _wait_reply(page, 1)
    assert len(_user_texts(page)) == 1
    assert retried != stopped and len(retried.split()) <= SHORT_REPLY
    _retry(page)
    reply = _wait_reply(page, 1)
    assert reply != retried or not retried  # a new sample (unless the model ended at once both times)
    for _ in range(5):  # the random demo model sometimes ends at once; the README wants words
        if reply:
            break
        _retry(page)
        reply = _wait_reply(page, 1)
    stats = page.locator("#chat-stats").inner_text()
    assert "tokens/s" in stats and "no compile" in stats, stats
    assert "Context: prompt" in page.locator("#context-meter").inner_text()

    _close_accordion(page, "Sampling and system prompt")
    _close_accordion(page, "Warm-up details")
    # Toasts left by the earlier refusals would cover the header of the README's picture: dismiss them.
    page.locator(".toast-close").evaluate_all("buttons => buttons.forEach(b => b.click())")
    page.wait_for_function("() => !document.querySelector('.toast-body')")
    _shot(page, "04-chat")

    # Undo: a second exchange disappears again and its message goes back into the box.
    _send(page, "and one more thing")
    _wait_reply(page, 2)
    assert len(_user_texts(page)) == 2
    page.locator("#chatbot button[aria-label=Undo]").last.click()
    page.wait_for_function("() => document.querySelectorAll('#chatbot .message-row.user-row').length === 1")
    assert len(_bot_texts(page)) == 1
    assert _message_box(page).input_value() == "and one more thing"
    # the stats line belonged to the undone reply: it goes too
    page.wait_for_function("() => document.querySelector('#chat-stats').innerText.trim() === ''")
    _message_box(page).fill("")


def test_thinking_toggle_switches_to_qwen_thinking_sampling(page):
    """With thinking on, the sliders move to Qwen's thinking defaults and a reply still comes.

    The folded reasoning block itself cannot appear here: the demo model suppresses the
    <think> tokens (random tags would open blocks that never close), so it never reasons.
    """
    _wait_ready(page)
    _open_accordion(page, "Sampling and system prompt")
    temperature, top_p = page.get_by_label("number input for Temperature"), page.get_by_label("number input for top_p")
    assert (temperature.input_value(), top_p.input_value()) == ("0.7", "0.8")
    page.get_by_label("Thinking (show the model's reasoning)").check()
    page.wait_for_function("() => document.querySelector('[aria-label=\"number input for Temperature\"]')"
                           ".value === '0.6'")
    assert top_p.input_value() == "0.95"
    bots = len(_bot_texts(page))
    _send(page, "What is 17 * 23? Think it through.")
    _wait_reply(page, bots + 1)
    page.get_by_label("Thinking (show the model's reasoning)").uncheck()
    page.wait_for_function("() => document.querySelector('[aria-label=\"number input for top_p\"]').value === '0.8'")
    assert temperature.input_value() == "0.7"


def test_export_downloads_json_and_markdown(page):
    _wait_ready(page)
    assert not page.locator("#export-file").is_visible()  # no empty drop zone before there is a file
    page.locator("#export-json").click()
    link = page.locator("#export-file a.download-link")
    page.wait_for_function("() => (document.querySelector('#export-file a.download-link') || {}).download"
                           "?.endsWith('.json')")
    with page.expect_download() as download:
        link.click()
    document = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    assert document["format"] == "trainium-showcase-chat" and document["version"] == 1
    messages = document["messages"]
    assert [m["role"] for m in messages][:2] == ["user", "assistant"]
    assert "Tell me a long story about compilers." in json.dumps(messages)
    assert set(document["settings"]) >= {"thinking", "temperature", "seed"} and "model" in document
    assert any("seed" in m.get("stats", {}) for m in messages if m["role"] == "assistant")  # per-reply stats
    assert all(isinstance(m["content"], str) for m in messages)  # text, not Gradio's parts

    page.locator("#export-md").click()
    page.wait_for_function("() => (document.querySelector('#export-file a.download-link') || {}).download"
                           "?.endsWith('.md')")
    with page.expect_download() as download:
        link.click()
    markdown = Path(download.value.path()).read_text(encoding="utf-8")
    assert markdown.startswith("# Conversation with")
    assert "## You" in markdown and "## Assistant" in markdown and "Tell me a long story about compilers." in markdown
    assert '"type": "text"' not in markdown and "tokens/s" in markdown  # reads as a conversation, stats per reply


def test_a_json_export_loads_back_into_the_chat(page, tmp_path):
    """Load JSON: an exported conversation (reasoning, notices, stats, settings) fills the chat and the
    controls; the conversation goes on from there, and exports again with its stats."""
    _wait_ready(page)
    document = {"format": "trainium-showcase-chat", "version": 1, "model": "x", "system_prompt": "Loaded system",
                "settings": {"temperature": 0.3, "seed": 77, "greedy": False},
                "messages": [{"role": "user", "content": "Loaded question"},
                             {"role": "assistant", "content": "Loaded answer", "reasoning": "Loaded reasoning",
                              "stats": {"new_tokens": 2, "seed": 77, "tokens_per_s": 1.0,
                                        "time_to_first_token_s": 0.1, "finish_reason": "eos"}}]}
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    # A reply first, so a stats line shows (clearing the chat takes the last one away)
    clear = page.locator("#chatbot").get_by_label("Clear")  # shown while the chat has messages
    if clear.count():
        clear.first.click()
    page.wait_for_function("() => !document.querySelector('#chat-stats').innerText.trim()")
    _send(page, "a reply before the load")
    page.wait_for_function("() => document.querySelector('#chat-stats').innerText.includes('tokens/s')",
                           timeout=REPLY_TIMEOUT_MS)
    with page.expect_file_chooser() as chooser:
        page.locator("#load-json").click()
    chooser.value.set_files(str(path))
    page.wait_for_function("() => document.querySelector('#chatbot').innerText.includes('Loaded answer')")
    # The loaded conversation replaced the chat: the stats of the reply before it are gone, the meter is idle.
    page.wait_for_function("() => !document.querySelector('#chat-stats').innerText.trim()")
    assert page.locator("#context-meter").inner_text().startswith("Context: prompt buckets")
    assert _user_texts(page) == ["Loaded question"]
    _open_accordion(page, "Sampling and system prompt")  # open already when an earlier test opened it
    assert page.get_by_label("System prompt").input_value() == "Loaded system"
    assert page.get_by_label("number input for Temperature").input_value() == "0.3"
    assert _seed_box(page).input_value() == "77"
    _close_accordion(page, "Warm-up details")
    _shot(page, "05-chat-loaded")
    _send(page, "and then?")
    _wait_reply(page, 2)
    assert _user_texts(page) == ["Loaded question", "and then?"]
    page.locator("#export-json").click()
    page.wait_for_function("() => (document.querySelector('#export-file a.download-link') || {}).download"
                           "?.endsWith('.json')")
    with page.expect_download() as download:
        page.locator("#export-file a.download-link").click()
    again = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))["messages"]
    assert again[1] == {**document["messages"][1]} and again[2]["content"] == "and then?"


def test_image_sizes_progress_png_parameters_and_gallery(page):
    _wait_ready(page)
    page.locator("#image-tab-button").click()
    options = _size_options(page)
    assert [o.split(" ")[0] for o in options] == [*SIZES, SLOW_SIZE], options
    assert all(o.endswith("· ready") for o in options), options

    # Before any image: no Stop (nothing runs) and no empty gallery; the files are folded under the picture.
    assert not page.locator("#stop-image").is_visible() and not page.locator("#gallery").is_visible()
    page.evaluate("window.__progress = []")
    image = _generate(page, "a lighthouse at dusk, watercolor", "96x64", steps=PROGRESS_STEPS)
    # The run's end shows the gallery and hides Stop: hidden components mount only when shown, a frame or more
    # after the PNG link above updates, so each is awaited, not sampled once.
    page.locator("#gallery").wait_for(state="visible")
    page.locator("#stop-image").wait_for(state="hidden")
    assert image.size == (96, 64)
    assert "a lighthouse at dusk, watercolor" in image.text["parameters"]
    assert f"Steps: {PROGRESS_STEPS}" in image.text["parameters"]
    progress = page.evaluate("window.__progress")
    assert any(re.match(rf"step \d+/{PROGRESS_STEPS}", p) for p in progress), f"no progress bar with steps: {progress}"
    shown = page.locator("#image-out img").evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert shown == [96, 64]
    params = page.locator("#image-params").inner_text().replace("\n", "")  # the JSON viewer, one token a line
    assert '"size":"96x64"' in params and f'"steps":{PROGRESS_STEPS}' in params, params

    second = _generate(page, "a golden retriever surfing a wave", "64x64", steps=2)
    assert second.size == (64, 64)
    thumbs = page.locator("#gallery .thumbnail-item")
    page.wait_for_function("() => document.querySelectorAll('#gallery .thumbnail-item').length === 2")
    captions = page.locator("#gallery .caption-label").all_inner_texts()  # the thumbnails' names
    assert thumbs.count() == 2 and any("96x64" in c for c in captions) and any("64x64" in c for c in captions)
    _shot(page, "05-image")


def test_hostile_text_is_shown_and_runs_nothing(page):
    _wait_ready(page)
    page.locator("#chat-tab-button").click()
    _send(page, HOSTILE)
    _wait_reply(page, len(_bot_texts(page)) + 1)
    user = _user_texts(page)[-1]
    assert "<script>window.__pwned=1</script>" in user and 'onerror="window.__pwned=1"' in user, user
    assert page.locator("#chatbot script, #chatbot img[onerror]").count() == 0
    _shot(page, "06-hostile-chat")

    _generate(page, HOSTILE, "64x64", steps=1)
    assert "<script>window.__pwned=1</script>" in page.locator("#image-params").inner_text()
    assert "<script>window.__pwned=1</script>" in page.locator("#python-snippet").inner_text()
    assert page.locator("#python-snippet .cm-lineNumbers").count() == 0  # no gutter to drift from the lines
    assert page.locator("#image-tab script, #image-tab img[onerror]").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    _shot(page, "07-hostile-image")


# Typed text that the old chatbot lost or made live: each must show exactly as typed.
LITERAL_TEXTS = ["List<String>", "if a<b and c>d", "<unknown-tag>inside</unknown-tag>",
                 '<div style="position:fixed;inset:0;background:red" id="cover">covered</div>',
                 '<a href="http://127.0.0.1:9/x" id="live-link">link</a>',
                 "<details open><summary>sum</summary>hidden</details>"]


def test_chat_shows_text_exactly_as_typed_and_nothing_live(page):
    _wait_ready(page)
    page.locator("#chat-tab-button").click()
    # Four messages: each must fit the demo preset's largest prompt bucket (128 byte-level tokens).
    for message in (" ".join(LITERAL_TEXTS[:3]), *LITERAL_TEXTS[3:]):
        bots = len(_bot_texts(page))
        _send(page, message)
        _wait_reply(page, bots + 1)
        assert message in _user_texts(page)[-1], f"{message!r} not shown as typed: {_user_texts(page)[-1]!r}"
    _shot(page, "09-chat-literal-text")
    # Nothing of the typed markup became an element (Gradio's own folded notices use <details>: only
    # the rendered message text, ".md", is searched for that one).
    live = page.locator("#cover, #live-link, unknown-tag, #chatbot .md details")
    assert live.count() == 0, live.evaluate_all("els => els.map(e => e.outerHTML.slice(0, 200))")
    assert page.locator("#chatbot .md [style]").count() == 0
    # A typed URL may become Markdown's autolink, showing itself; no link hides behind other text.
    links = page.locator("#chatbot .md a").evaluate_all("as => as.map(a => [a.textContent, a.getAttribute('href')])")
    assert all(text == href for text, href in links), links


def test_a_refused_message_leaves_the_chat_usable(page):
    """After a refusal the box is enabled again, Stop is gone, the next message works."""
    _wait_ready(page)
    page.locator("#chat-tab-button").click()
    bots = len(_bot_texts(page))
    _send(page, "x" * 20_001)  # over --max-prompt-chars (20000)
    toast = page.get_by_test_id("toast-body").filter(has_text="20000")
    toast.first.wait_for(timeout=REPLY_TIMEOUT_MS)
    page.locator("#chatbot", has_text="Not answered").wait_for()
    page.wait_for_function("() => { const s = document.querySelector('#chat-tab button.stop-button');"
                           " return !(s && s.offsetParent !== null); }")
    box = _message_box(page)
    page.wait_for_function("() => !document.querySelector('#chat-tab textarea').disabled")
    assert page.locator("#chat-tab .error, #chat-tab [data-testid=status-tracker] .error").count() == 0
    _shot(page, "10-chat-refused")
    page.evaluate("document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click())")
    _send(page, "and now a normal one")
    _wait_reply(page, bots + 2)  # the note, then a real reply
    page.wait_for_function("() => !document.querySelector('#chat-tab textarea').disabled")
    assert box.is_editable()


def test_two_tabs_at_once_both_get_answers(page, context):
    _wait_ready(page)
    tabs = [context.new_page() for _ in range(2)]
    try:
        for tab in tabs:
            tab.goto(page.url)
            tab.evaluate(WATCH_CHAT_JS)
            _wait_ready(tab)
            _short_replies(tab)
        for i, tab in enumerate(tabs):  # both questions in flight together
            _send(tab, f"hello from tab {i}")
        for tab in tabs:
            assert len(_wait_reply(tab, 1).split()) <= SHORT_REPLY

        # One tab chats while the other draws: neither waits on the other forever.
        _send(tabs[0], "and a second question")
        image = _generate(tabs[1], "two tabs", "64x64", steps=2)
        _wait_reply(tabs[0], 2)
        assert image.size == (64, 64)
        for i, tab in enumerate(tabs):
            _shot(tab, f"08-tab-{'ab'[i]}")
    finally:
        for tab in tabs:
            tab.close()


def test_qa_bench_runs_a_set_marks_a_cell_and_exports(page):
    """The QA tab as a reviewer uses it."""
    _wait_ready(page)
    page.get_by_role("tab", name="QA bench").click()
    page.locator("#qa-prompts textarea").fill("first prompt\nsecond prompt\n<b>third</b> prompt")
    page.locator("#qa-variants textarea").fill("short: max_new_tokens=4, seed=1\nlonger: max_new_tokens=8, seed=2")
    page.locator("#qa-run").click()
    page.wait_for_function("() => document.querySelector('#qa-status textarea').value"
                           ".startsWith('Finished: 6/6 cells done')", timeout=REPLY_TIMEOUT_MS)  # text, not HTML
    grid = page.locator("#qa-grid")
    for text in ("first prompt", "second prompt", "<b>third</b> prompt"):  # hostile text stays text
        assert grid.get_by_text(text, exact=False).count() >= 1
    assert grid.locator("th", has_text="short").count() and grid.locator("th", has_text="longer").count()
    # Pick the "longer" cell of the first prompt, mark it failed with a comment.
    # (Gradio keeps a hidden copy of the table for measuring: click the visible cell.)
    grid.get_by_text(re.compile(r"seed 2")).filter(visible=True).first.click()
    page.wait_for_function("() => document.querySelector('#qa-cell input').value === '2'")  # 1-based, as the grid
    page.locator("#qa-mark").get_by_text("fail", exact=True).click()
    page.locator("#qa-comment textarea").fill("too short")
    page.locator("#qa-save-mark").click()
    grid.get_by_text("fail", exact=False).filter(visible=True).first.wait_for(timeout=REPLY_TIMEOUT_MS)
    _shot(page, "qa-bench")
    page.locator("#qa-export-html").click()
    page.wait_for_function("() => (document.querySelector('#qa-export-file a.download-link') || {}).download"
                           "?.endsWith('.html')")
    with page.expect_download() as download:
        page.locator("#qa-export-file a.download-link").click()
    report = Path(download.value.path()).read_text(encoding="utf-8")
    assert "too short" in report and "fail" in report and "&lt;b&gt;third&lt;/b&gt;" in report
    assert "<b>third</b>" not in report
    page.get_by_role("tab", name="Chat").click()


# ----- image wing: live preview, several images, paste-back, stop while queued -----
# The labels #image-out has shown, in order ("Preview · image 1 · step 3/50", ..., "Image").
RECORD_IMAGE_LABELS_JS = """() => {
  window.__imageLabels = [];
  const record = () => {
    const label = document.querySelector('#image-out [data-testid=block-label]');
    const text = label ? label.textContent.trim() : '';
    const img = document.querySelector('#image-out img');
    const entry = text + ' | ' + (img ? img.naturalWidth + 'x' + img.naturalHeight : '');
    if (text && window.__imageLabels[window.__imageLabels.length - 1] !== entry) window.__imageLabels.push(entry);
  };
  new MutationObserver(record).observe(document.body, {subtree: true, childList: true, characterData: true,
                                                       attributes: true});
}"""


def _a1111_png(path: Path, size: str, steps: int, seed: int, prompt: str) -> Path:
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", f"{prompt}\nNegative prompt: blurry\nSteps: {steps}, Sampler: Euler a, "
                                f"CFG scale: 7, Seed: {seed}, Size: {size}, Model hash: 0123abcd")
    width, height = (int(v) for v in size.split("x"))
    Image.new("RGB", (width, height), (90, 120, 200)).save(path, pnginfo=info)
    return path


def test_live_preview_appears_before_the_final_images_of_a_several_image_run(page, app_url):
    _wait_image_sizes_ready(page, app_url)
    page.evaluate(RECORD_IMAGE_LABELS_JS)
    assert page.locator("#image-live-preview input").is_checked()
    _set_number(page, "number input for Images per run", 2)
    before = page.locator("#gallery .thumbnail-item").count()
    page.locator("#image-prompt textarea").fill("a red fox in the snow")
    _choose_size(page, "96x64")
    # Idle, no band is kept for a progress line: the picture sits right under the prompt row.
    assert not page.locator("#image-progress").is_visible()
    prompt_row, picture = (page.locator(s).bounding_box() for s in ("#image-prompt", "#image-out"))
    assert picture["y"] - (prompt_row["y"] + prompt_row["height"]) < 40, (prompt_row, picture)
    _set_number(page, "number input for Steps", 50)
    with held(page.url, "image", after_steps=5) as hold_again:  # each picture read while the run waits
        page.locator("#generate").click()
        # What the eye sees mid-run: the image box shows the preview picture (no progress overlay on it), and
        # the picture changes as it denoises; the one progress bar sits above it.
        label = page.locator("#image-out [data-testid=block-label]")
        label.filter(has_text="Preview").wait_for(timeout=REPLY_TIMEOUT_MS)
        first_src, first = _steady_picture(page)
        # The bar stays on while the run waits: each output of the event hides Gradio's bar until the next
        # progress message, so a frame with no bar may only follow a new picture (one frame or two).
        blinks = page.evaluate(BAR_BLINKS_JS, [1500, "#image-out img"])
        assert not blinks, f"the progress bar went out with no new picture at {blinks} ms"
        hold_again(5)
        # the next preview frame drawn: another picture in the box, loaded (its label comes first, its image
        # after), and the progress bar shown with it, above the picture and nowhere else
        bars = page.wait_for_function(
            "old => { const i = document.querySelector('#image-out img'),"
            " l = document.querySelector('#image-out [data-testid=block-label]');"
            " if (!(i && i.src !== old && i.complete && i.naturalWidth > 0"
            " && l.textContent.trim().startsWith('Preview'))) return false;"
            f" const bars = ({BARS_OVER_JS})(); return bars.length ? bars : false; }}",
            arg=first_src, timeout=REPLY_TIMEOUT_MS).json_value()
        _, second = _steady_picture(page)
        _shot(page, "06-image-preview-mid-run")
    for picture in (first, second):
        stat = ImageStat.Stat(picture.convert("L"))
        assert stat.stddev[0] > 8 and stat.mean[0] < 235, (stat.mean, stat.stddev)  # a picture, not a blank box
    assert ImageChops.difference(first, second).getbbox() is not None, "the preview stood still"  # any pixel
    assert bars and set(bars) == {"image-progress"}, bars
    page.wait_for_function(f"() => document.querySelectorAll('#gallery .thumbnail-item').length === {before + 2}",
                           timeout=REPLY_TIMEOUT_MS)
    page.locator("#image-progress").wait_for(state="hidden")  # the run over, its line gives its room back
    labels = page.evaluate("window.__imageLabels")
    previews = [i for i, text in enumerate(labels) if text.startswith("Preview · image")]
    finals = [i for i, text in enumerate(labels) if text.startswith("Image |") and text.endswith("96x64")]
    assert previews and finals and previews[0] < finals[-1], labels
    assert any(re.match(r"Preview · image \d · step \d+/50 \| 96x64", labels[i]) for i in previews), labels
    captions = page.locator("#gallery .caption-label").all_inner_texts()  # the thumbnails' names
    seeds = [int(m.group(1)) for c in captions[-2:] if (m := re.match(r"seed (\d+) · 96x64", c))]
    assert len(seeds) == 2 and seeds[1] == seeds[0] + 1, captions  # consecutive seeds
    # Whole thumbnails: the picture is scaled to fit its tile (object-fit contain), captions shown.
    fits = page.locator("#gallery .thumbnail-item img").evaluate_all(
        "imgs => imgs.map(i => getComputedStyle(i).objectFit)")
    assert set(fits) == {"contain"}, fits
    for item in page.locator("#gallery .thumbnail-item").all()[-2:]:  # each caption inside the visible gallery
        item.scroll_into_view_if_needed()
        label, box = item.locator(".caption-label"), page.locator("#gallery .grid-wrap").bounding_box()
        shown = label.bounding_box()
        assert label.is_visible() and shown["y"] + shown["height"] <= box["y"] + box["height"] + 1, (shown, box)
    _open_accordion(page, "PNG, parameters and Python")
    assert page.locator("#png-file a.download-link").count() == 2
    _set_number(page, "number input for Images per run", 1)
    _shot(page, "06-image-preview-several")


def test_dropped_png_fills_the_form_and_a_foreign_size_is_refused(page, tmp_path):
    page.locator("#image-tab-button").click()
    _open_accordion(page, "Restore settings from a PNG")
    good = _a1111_png(tmp_path / "a1111.png", "64x64", 7, 4242, "a blue whale, ink drawing")
    page.locator("#paste-png input[type=file]").set_input_files(str(good))
    page.wait_for_function(
        "() => document.querySelector('#image-prompt textarea').value === 'a blue whale, ink drawing'")
    assert page.locator("#image-size input").input_value().startswith("64x64")
    assert page.get_by_label("number input for Steps", exact=True).input_value() == "7"
    assert page.locator("#image-seed input").input_value() == "4242"
    assert not page.locator("#image-randomize input").is_checked()
    page.locator("#paste-note", has_text="Restored from the PNG").wait_for()
    _shot(page, "07-image-paste-back")
    page.locator("#paste-png button[aria-label='Clear']").first.click()
    foreign = _a1111_png(tmp_path / "foreign.png", "512x512", 20, 1, "not served here")
    page.locator("#paste-png input[type=file]").set_input_files(str(foreign))
    page.locator(".toast-body", has_text="Allowed sizes: 64x64, 96x64").first.wait_for()
    assert page.locator("#image-prompt textarea").input_value() == "a blue whale, ink drawing"  # unchanged


def test_stop_while_queued_drops_the_image_and_stop_while_running_stops_it(page, context):
    page.locator("#image-tab-button").click()
    other = context.new_page()
    other.goto(page.url)
    other.locator("#image-tab-button").click()
    # The first tab holds the image engine with a long run (the slow size, 50 steps).
    page.locator("#image-prompt textarea").fill("a long run")
    _choose_size(page, SLOW_SIZE)
    _set_number(page, "number input for Steps", 50)
    with held(page.url, "image", after_steps=5):  # both Stops land while the run is on, however slow the page
        page.locator("#generate").click()
        page.locator("#image-tab .progress-level", has_text="step").first.wait_for(timeout=REPLY_TIMEOUT_MS)
        # The second tab's request waits in the queue; Stop there drops it before it starts.
        other.locator("#image-prompt textarea").fill("queued then stopped")
        other.locator("#generate").click()
        other.wait_for_function(BAR_SEEN_IN_JS, arg="#image-tab", timeout=REPLY_TIMEOUT_MS)  # queued, on screen
        other.locator("#stop-image").click()
        stop_held_image(page)  # and the running one stops at the step it is held at
    other.locator(".toast-body", has_text="Stopped before it started").first.wait_for(timeout=REPLY_TIMEOUT_MS)
    assert other.locator("#gallery .thumbnail-item").count() == 0
    # The running one shows its stopped image (the queued one's toast may come first: Stop takes it out of
    # the queue at once, while the running one ends after its current step).
    _open_accordion(page, "PNG, parameters and Python")
    page.wait_for_function("() => /\"stopped\"\\s*:\\s*true/.test(document.querySelector('#image-params').innerText)",
                           timeout=REPLY_TIMEOUT_MS)
    params = page.locator("#image-params").inner_text().replace("\n", "")
    assert '"stopped":true' in params and '"steps_done":5' in params, params  # at the step it was held at
    snippet = page.locator("#python-snippet").inner_text()
    # The run makes the images the module's earlier tests chose: Stop lands in its first image, or (on a busy
    # host) after the first was made; the snippet says which.
    said = r"This image was stopped after|This run was stopped: \d+ of \d+ images were made"
    assert re.search(said, snippet), snippet
    _shot(other, "08-image-stopped-while-queued")
    other.close()
