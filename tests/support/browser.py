"""The browser tests' app process and page helpers (headless Chromium through Playwright).

``running_app`` starts the app on the demo models in a subprocess (``--models tiny --device cpu``) with
its cache root outside the working directory and the temp dir, as the default ~/.cache is. Every wait
is on a condition in the page, never a sleep and never "networkidle" (Gradio's event stream never idles).
Screenshots land in ``test-artifacts/screenshots/`` (git-ignored).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
README_SCREENSHOT = ROOT / "assets" / "screenshot.png"

SIZES = ("64x64", "96x64")
# Warms up last; test_browser.py holds its warm-up (gated_app.py's size gate) until the page has asked for
# it and seen it refused as still warming up.
SLOW_SIZE = "1024x1024"
# Long enough (~4 s) to press stop mid-reply; every other reply is cut to SHORT_REPLY tokens
# through the "Max new tokens" slider, as a user would.
MAX_NEW_TOKENS = 160
SHORT_REPLY = 24
# Enough denoising steps (~1-4 s) for the page to show the progress bar (the app reports every 0.1 s).
PROGRESS_STEPS = 40
HOSTILE = 'look <script>window.__pwned=1</script> and <img src=x onerror="window.__pwned=1"> end'
READY_TIMEOUT_MS = 120_000
REPLY_TIMEOUT_MS = 60_000

# Watches the chat from inside the page: the distinct texts of the last bot message (to see it
# stream) and whether the stop button has shown since the last reset (a reply event ran), so a
# reply that ends before Python looks, or that is empty (the demo model may stop at once), is
# still seen to end.
# A reply event ran ("__busySeen") once the chat's Stop button was drawn, shown or hidden: read from the mutation
# records, not from the button's state when the observer runs, because a short reply's Stop may come and go
# within one batch of mutations (one task), and the observer then sees only the end.
WATCH_CHAT_JS = """() => {
  window.__replies = [];
  window.__busySeen = false;
  const STOP = 'button.stop-button';
  const isStop = (node) => node.nodeType === 1 && (node.matches(STOP) || node.querySelector(STOP) !== null);
  const inChat = (node) => node.nodeType === 1 && node.matches('#chat-tab ' + STOP);
  const watch = (records) => {
    for (const r of records) {
      if ((r.type === 'attributes' && ['class', 'style', 'hidden'].includes(r.attributeName) && inChat(r.target))
          || (r.type === 'childList' && r.target.closest && r.target.closest('#chat-tab')
              && [...r.addedNodes, ...r.removedNodes].some(isStop))) window.__busySeen = true;
    }
    const rows = document.querySelectorAll('#chatbot .message-row.bot-row');
    const text = rows.length ? rows[rows.length - 1].innerText.trim() : '';
    if (text && window.__replies[window.__replies.length - 1] !== text) window.__replies.push(text);
    const stop = document.querySelector('#chat-tab ' + STOP);
    if (stop && stop.offsetParent !== null) window.__busySeen = true;
  };
  new MutationObserver(watch).observe(document.body, {subtree: true, childList: true, characterData: true,
                                                      attributes: true});
}"""
# Texts of Gradio's progress bar ("step 2/6 · ~0.4 s left - 33%") as they appear.
RECORD_PROGRESS_JS = """() => {
  window.__progress = [];
  new MutationObserver(() => {
    for (const el of document.querySelectorAll('#image-tab .progress-level')) {
      const text = el.textContent.trim();
      if (text && !window.__progress.includes(text)) window.__progress.push(text);
    }
  }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
}"""
# A reply is complete: a reply event ran since the last reset, the stop button is gone again and
# the chat holds the expected number of bot messages.
REPLY_DONE_JS = """(bots) => {
  const rows = document.querySelectorAll('#chatbot .message-row.bot-row');
  const stop = document.querySelector('#chat-tab button.stop-button');
  return window.__busySeen && !(stop && stop.offsetParent !== null) && rows.length === bots;
}"""
# The warm-up table as rows of cell texts: task, shape, state, seconds, compile cache, error.
TABLE_ROWS_JS = """() => Array.from(document.querySelectorAll('#warmup-table [role=row].virtual-row'))
  .map(row => Array.from(row.querySelectorAll('[role=gridcell]')).map(cell => cell.innerText.trim()))
  .filter(cells => cells.length && cells[0])"""


# Whether the eye sees an element. Gradio writes a pending event's progress text into the status tracker of
# each of its outputs and, for an event with show_progress="hidden" (the header's poll, whose outputs are the
# status bar and the size list), hides that tracker with opacity 0: in the layout, never on the screen. A poll
# that a busy host keeps pending for a while is not a bar anyone sees.
SEEN_JS = "e => e.checkVisibility({opacityProperty: true, visibilityProperty: true})"
# The element ids of the boxes a progress bar is drawn over now (the nearest element with an id).
BARS_OVER_JS = f"""() => [...new Set([...document.querySelectorAll('.progress-text, .progress-level, .eta-bar')]
  .filter({SEEN_JS}).map(e => e.closest('[id]')?.id))]"""
# A progress bar the eye sees inside the element ``selector`` names.
BAR_SEEN_IN_JS = f"""selector => [...document.querySelectorAll(selector)]
  .some(box => [...box.querySelectorAll('.progress-text, .progress-level, .eta-bar')].some({SEEN_JS}))"""
# Samples the page for ``ms`` milliseconds, one sample an animation frame; resolves to the times of samples
# that showed no progress bar more than 150 ms after ``watched`` (an element: its src, else its value, else
# its text) last changed. Gradio hides an event's bar at each output until the event's next progress
# message: a gap may follow a change the event sent, never stand on its own.
BAR_BLINKS_JS = f"""([ms, watched]) => new Promise(done => {{
  const t0 = performance.now(), blinks = [];
  let seen = null, changed = -1e9;
  const tick = () => {{
    const now = performance.now() - t0, el = document.querySelector(watched);
    const value = el ? (el.src || el.value || el.innerText) : null;
    if (value !== seen) {{ seen = value; changed = now; }}
    const bar = [...document.querySelectorAll('.progress-level, .eta-bar')].some({SEEN_JS});
    if (!bar && now - changed > 150) blinks.push(Math.round(now));
    if (now < ms) requestAnimationFrame(tick); else done(blinks);
  }};
  requestAnimationFrame(tick);
}})"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_http(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with code {proc.returncode}:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)  # polling a port that is not open yet: there is no page to wait on
    raise RuntimeError(f"the app did not answer at {url} within {timeout_s:.0f} s:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# ----- page helpers -----------------------------------------------------------------------------
def _shot(page, name: str, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def _wait_ready(page) -> None:
    page.locator("#warmup-state", has_text="Warm-up done").wait_for(timeout=READY_TIMEOUT_MS)


def _table_states(page) -> dict[str, str]:
    return {row[0]: row[2] for row in page.evaluate(TABLE_ROWS_JS)}


def _open_accordion(page, title: str) -> None:
    """Open a Gradio accordion by its title (a no-op when it is open already)."""
    header = page.locator("button.label-wrap", has_text=title).last
    if "open" not in (header.get_attribute("class") or ""):
        header.click()


def _close_accordion(page, title: str) -> None:
    header = page.locator("button.label-wrap", has_text=title).last
    if "open" in (header.get_attribute("class") or ""):
        header.click()


def _seed_box(page):
    return page.get_by_label("Seed (-1 = random)")


def _set_number(page, label: str, value, within: str = "body") -> None:
    """Type into a slider's or number's input box (the one under ``within``) and leave it with Tab, as a user
    would. (fill() + Enter right after a page loads can lose the value: the slider snaps back to its default.)
    """
    box = page.locator(within).get_by_label(label, exact=True)
    box.click()
    box.press("Control+A")
    box.press_sequentially(str(value))
    box.press("Tab")
    assert box.input_value() == str(value)


NO_TEXT = "⚠ The model produced no text"  # the notice of a reply that ended at its first token


def _bot_texts(page) -> list[str]:
    """Each reply's answer: the first line of its row (notices such as "stopped at the limit" follow it); ""
    for a reply with no text, which shows only the no-text notice (the random demo model ends at once now and
    then)."""
    firsts = [t.strip().split("\n")[0] for t in page.locator("#chatbot .message-row.bot-row").all_inner_texts()]
    return ["" if first == NO_TEXT else first for first in firsts]


def _user_texts(page) -> list[str]:
    return [t.strip() for t in page.locator("#chatbot .message-row.user-row").all_inner_texts()]


def _wait_reply(page, bots: int) -> str:
    """Wait until the reply event of the last ``_send``/``_retry`` ended with ``bots`` replies; return the last."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(REPLY_DONE_JS, arg=bots, timeout=REPLY_TIMEOUT_MS)
    except PlaywrightTimeout:
        shot = _shot(page, f"failed-reply-{time.strftime('%H%M%S')}")
        pytest.fail(f"no complete reply #{bots}: bot messages {_bot_texts(page)}, user {_user_texts(page)}; see {shot}")
    return _bot_texts(page)[-1]


def _message_box(page):
    # The placeholder goes once the chat has messages; the message box comes before the system prompt's.
    return page.locator("#chat-tab textarea").first


def _send(page, text: str) -> None:
    page.evaluate("window.__busySeen = false")
    box = _message_box(page)
    box.fill(text)
    box.press("Enter")


def _retry(page) -> None:
    page.evaluate("window.__busySeen = false")
    page.locator("#chatbot button[aria-label=Retry]").last.click()


def _short_replies(page) -> None:
    _open_accordion(page, "Sampling and system prompt")
    _set_number(page, "number input for Max new tokens", SHORT_REPLY)


def _choose_size(page, size: str) -> str:
    """Pick a size in the picker; return the label the picker showed for it."""
    page.locator("#image-size input").click()
    option = page.locator("[role=option]", has_text=f"{size} (")
    label = option.inner_text().replace("✓", "").strip()
    option.click()
    return label


def _size_options(page) -> list[str]:
    page.locator("#image-size input").click()
    page.locator("[role=option]").first.wait_for()
    labels = [t.replace("✓", "").strip() for t in page.locator("[role=option]").all_inner_texts()]
    page.keyboard.press("Escape")
    return labels


def _steady_picture(page) -> tuple[str, Image.Image]:
    """The image box's picture and its source, from a screenshot during which no new frame came."""
    shown = ("() => { const i = document.querySelector('#image-out img');"
             " return i && i.complete && i.naturalWidth > 0 ? i.src : null; }")
    for _ in range(20):
        before = page.evaluate(shown)
        picture = _picture(page)
        if before and page.evaluate(shown) == before:
            return before, picture
    raise AssertionError("the image box never kept one picture through a screenshot")


def _picture(page) -> Image.Image:
    """The picture area of the image box as the screen shows it (below its label, inside its border)."""
    box = page.locator("#image-out")
    box.scroll_into_view_if_needed()
    shot = Image.open(io.BytesIO(box.screenshot())).convert("RGB")
    return shot.crop((4, 40, shot.width - 4, shot.height - 4))


def _generate(page, prompt: str, size: str, steps: int) -> Image.Image:
    """Generate one image from the Image tab; return the PNG behind the download link."""
    page.locator("#image-tab-button").click()
    _open_accordion(page, "PNG, parameters and Python")
    page.locator("#image-prompt textarea").fill(prompt)
    _choose_size(page, size)
    _set_number(page, "number input for Steps", steps)
    old = page.locator("#png-file a.download-link").get_attribute("href") \
        if page.locator("#png-file a.download-link").count() else None
    page.locator("#generate").click()
    page.wait_for_function(
        "old => { const a = document.querySelector('#png-file a.download-link'); return a && a.href !== old; }",
        arg=old, timeout=REPLY_TIMEOUT_MS)
    # The link updates a frame or more before the run's last event shows the gallery and hides Stop; a click
    # while that moves the page can land beside the link (no download). Clicked once the run has ended.
    page.locator("#stop-image").wait_for(state="hidden", timeout=REPLY_TIMEOUT_MS)
    with page.expect_download() as download:
        page.locator("#png-file a.download-link").click()
    image = Image.open(download.value.path())
    image.load()
    return image


def _wait_image_sizes_ready(page, url: str) -> None:
    """Every image size warmed up, as /status says (the image wing's tests do not wait for the chat's)."""
    from gradio_client import Client

    client, deadline = Client(url, verbose=False), time.time() + READY_TIMEOUT_MS / 1000
    while True:
        tasks = [t for t in client.predict(api_name="/status")["tasks"]
                 if t.get("engine") == "image" and t.get("kind") == "compile"]
        if tasks and all(t.get("state") == "ready" for t in tasks):
            break
        assert time.time() < deadline, tasks
        page.wait_for_timeout(500)
    page.locator("#image-tab-button").click()


PROCESSES: dict[str, subprocess.Popen] = {}  # each running_app's process by its URL (a test may kill one)


@contextlib.contextmanager
def running_app(log_name: str = "browser-app.log", *extra: str, hold: tuple[str, ...] = ()):
    """The app on the demo models in a subprocess, yielding its URL; its log goes to test-artifacts/.

    Text-to-image only (``--references 0``) unless ``extra`` flags (which come last, so they win) say otherwise.
    It runs through ``gated_app.py``, so ``held`` can hold a reply or an image mid-run; the gates named in
    ``hold`` hold from the start (their first step) until ``release``."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = _free_port()
    # The cache root sits outside the working directory and the temp dir, as the default ~/.cache does:
    # images and exports must still come back (Gradio serves only what launch(allowed_paths=) names).
    cache_root = Path.home() / f".showcase-browser-{port}"
    cmd = [sys.executable, str(Path(__file__).with_name("gated_app.py")), "--models", "tiny", "--device", "cpu",
           "--cache-dir", str(cache_root), "--port", str(port),
           "--sizes", ",".join((*SIZES, SLOW_SIZE)), "--max-new-tokens", str(MAX_NEW_TOKENS), "--references", "0",
           *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOWCASE_")}  # flags only
    env.update(HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1",
               BROWSER_TEST_GATE=str(_gate_folder(port)))
    for gate in hold:
        (_gate_folder(port) / gate).write_text("1")
    log_path = ARTIFACTS / log_name
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_for_http(url, proc, log_path, timeout_s=120)
        PROCESSES[url] = proc
        yield url
    finally:
        PROCESSES.pop(url, None)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(cache_root, ignore_errors=True)
        shutil.rmtree(_gate_folder(port), ignore_errors=True)


def _gate_folder(url_port: int | str) -> Path:
    folder = ARTIFACTS / f"gate-{url_port}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def held(url: str, gate: str, after_steps: int):
    """The app at ``url`` holds its chat replies (``gate="chat"``: decode steps) or images (``"image"``:
    denoising steps) at their ``after_steps``-th step until the block ends. It yields ``again(n)``, which
    lets the run go on and holds it ``n`` steps later.

    For a test that presses Stop or reads a picture mid-run: the server waits, however slow the page."""
    hold = _gate_folder(url.rstrip("/").rsplit(":", 1)[1]) / gate

    def again(steps: int) -> None:  # a new file (a new inode): the app counts its steps afresh
        fresh = hold.with_suffix(".new")
        fresh.write_text(str(steps))
        os.replace(fresh, hold)

    again(after_steps)
    try:
        yield again
    finally:
        hold.unlink(missing_ok=True)


def release(url: str, gate: str) -> None:
    """Let a gate of ``running_app(hold=...)`` or ``held`` go."""
    (_gate_folder(url.rstrip("/").rsplit(":", 1)[1]) / gate).unlink(missing_ok=True)


def stop_held_image(page) -> None:
    """Press the Image tab's Stop while ``held`` holds the run, and wait for the server's answer to it: the
    Stop's handler stops the run then, at its current step. (The click only sends the request: a hold ended
    right after it could let the run take more steps before the Stop arrives.)"""
    button = page.evaluate("() => window.gradio_config.components.find(c => c.props.elem_id === 'stop-image').id")
    with page.expect_response(lambda r: r.url.endswith("/gradio_api/run/predict")
                              and f'"trigger_id":{button},' in (r.request.post_data or "")):
        page.locator("#stop-image").click()


def stop_held_reply(page, press_stop, again, max_steps: int = 20) -> int:
    """Press Stop on a chat reply that ``held`` holds, and let the reply go on one decode step at a time
    until the server has answered the Stop; returns the steps let through.

    Releasing the hold right after the click races the Stop: the click only sends Gradio's ``/cancel``, and
    the reply could run to its end before the request arrives. Nor can the test just wait for the answer with
    the reply held: ``/cancel`` answers once the cancelled task has ended, which can take the reply's current
    step (seen with a reply from a chat server: one step let through, then the answer)."""
    with page.expect_response(lambda r: r.url.endswith("/gradio_api/cancel")) as answer:
        press_stop()
        for steps in range(max_steps):
            page.wait_for_timeout(100)  # Playwright takes in the page's events while it waits
            if answer.is_done():
                return steps
            again(1)
        raise AssertionError(f"the server did not answer Stop within {max_steps} decode steps")


def open_page(browser, url: str, locale: str, phone: bool = False):
    """A new browser context in ``locale`` and its page on ``url``, once the status bar and the tabs show; a
    desktop window, or a phone's (390x844, touch, its pixel ratio: Gradio draws some text smaller there)."""
    form = ({"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "device_scale_factor": 3}
            if phone else {"viewport": {"width": 1280, "height": 900}})
    context = browser.new_context(locale=locale, **form)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.goto(url)
    page.locator("#status-bar").wait_for()
    page.locator("button[role=tab]").first.wait_for()
    return context, page
