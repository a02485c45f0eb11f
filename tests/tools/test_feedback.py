"""Feedback marks under abuse: a mark is bounded by what the app accepts and produces, a session stores
a bounded number of marks, rotation never drops stored marks, and rows survive line separators in
their text. The page's own like event is driven over HTTP on 127.0.0.1, as an anonymous client would."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from support.app import app_parts, app_settings, free_port

import ui
from neuron_backend.errors import InvalidRequestError
from neuron_backend.plugins import Parts
from neuron_backend.runtime import Backend
from neuron_backend.settings import parse_settings
from tools.qa.feedback import (
    MAX_CHARS_PER_TOKEN,
    MAX_MARKS_PER_CLIENT,
    MAX_MARKS_PER_SESSION,
    MAX_QA_PROMPTS,
    FeedbackLog,
)


@pytest.fixture
def served(tmp_path):
    """The page on the tiny chat model (no warm-up: marks need no engine), and its like event's index."""
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-image",
                             "--port", str(free_port()), "--max-prompt-chars", "2000", "--max-new-tokens", "200",
                             "--feedback-max-bytes", "10000"])
    backend = Backend(settings)
    chat_extras = app_parts(settings).chat_extras
    demo, (_, url, _) = ui.serve(backend, Parts(chat_extras=chat_extras), prevent_thread_lock=True, quiet=True)
    index = next(i for i, f in demo.fns.items() if getattr(f.fn, "__name__", "") == "mark_reply")
    try:
        yield url, index, FeedbackLog.for_settings(settings)
    finally:
        demo.close()


def _mark(url: str, index: int, session: str, prompt: str, reply: str) -> httpx.Response:
    """Press 👍 on ``reply`` (answering ``prompt``) in Gradio session ``session``, as the page does."""
    history = [{"role": "user", "content": [{"type": "text", "text": prompt}]},
               {"role": "assistant", "content": [{"type": "text", "text": reply}]}]
    body = {"fn_index": index, "data": [history, None, None], "session_hash": session,
            "event_data": {"index": [1], "value": reply, "liked": True}}
    return httpx.post(url + "gradio_api/run/predict", json=body, timeout=30)


def test_a_mark_larger_than_a_reply_of_this_app_is_refused(served):
    url, index, log = served
    huge = _mark(url, index, "s-huge", "x" * 2001, "short")  # --max-prompt-chars 2000
    assert huge.status_code == 500 and "2000" in huge.json()["error"] and "--max-prompt-chars" in huge.json()["error"]
    limit = 200 * MAX_CHARS_PER_TOKEN
    long_reply = _mark(url, index, "s-huge", "q", "y" * (limit + 1))
    assert long_reply.status_code == 500 and str(limit) in long_reply.json()["error"]
    assert log.marks() == []
    assert _mark(url, index, "s-huge", "x" * 2000, "y" * limit).status_code == 200  # at the bounds: stored
    assert len(log.marks()) == 1


@pytest.mark.slow
def test_a_session_stores_a_bounded_number_of_marks(served):
    url, index, log = served
    codes = [_mark(url, index, "s-cap", f"q{i}", "a").status_code for i in range(MAX_MARKS_PER_SESSION)]
    assert codes == [200] * MAX_MARKS_PER_SESSION
    refused = _mark(url, index, "s-cap", "one more", "a")
    assert refused.status_code == 500 and f"stored {MAX_MARKS_PER_SESSION} marks" in refused.json()["error"]
    assert len(log.marks()) == MAX_MARKS_PER_SESSION
    assert _mark(url, index, "s-other", "another visitor", "a").status_code == 200  # per session, not global


@pytest.mark.slow
def test_an_attacker_filling_its_budget_cannot_remove_other_sessions_marks(served):
    url, index, log = served
    assert _mark(url, index, "victim", "What is a NEFF?", "a compiled graph").status_code == 200
    deadline, answers = time.monotonic() + 60, []
    for n in range(120):  # fresh sessions, maximal marks, until the storage refuses them
        assert time.monotonic() < deadline
        answers.append(_mark(url, index, f"attacker-{n // MAX_MARKS_PER_SESSION}", "x" * 2000, "y" * 3000))
        if [a.status_code for a in answers[-3:]] == [500] * 3:
            break
    codes = [a.status_code for a in answers]
    assert 200 in codes and codes[-3:] == [500] * 3, codes
    assert "storage is full" in answers[-1].json()["error"]
    stored = log.marks()
    assert stored[0]["prompt"] == "What is a NEFF?"  # still there, the oldest mark
    assert all(m["stats"] == {} and m["settings"] == {} for m in stored)  # no reply of this server: no stats
    assert sum(p.stat().st_size for p in log.files() if p.exists()) <= (log.rotations + 1) * log.max_bytes
    rows = [json.loads(line) for line in log.prompt_set.read_text().split("\n") if line]
    assert "What is a NEFF?" in [r["prompt"] for r in rows]


def test_a_loaded_conversation_cannot_give_a_mark_made_up_stats(served):
    """Load JSON fills the session's reply records for Export; a 👍 on such a reply stores no stats."""
    url, index, log = served
    demo_fns = httpx.get(url + "config", timeout=30).json()["dependencies"]
    load = next(d["id"] for d in demo_fns if d.get("api_name") == "load_conversation")
    made_up = {"new_tokens": 9999, "tokens_per_s": 123456.0, "seed": 7, "finish_reason": "eos"}
    document = {"format": "trainium-showcase-chat", "version": 1, "model": "x", "system_prompt": None,
                "settings": {"temperature": 0.3, "seed": 7},
                "messages": [{"role": "user", "content": "Crafted question"},
                             {"role": "assistant", "content": "Crafted answer", "stats": made_up}]}
    uploaded = httpx.post(url + "gradio_api/upload", timeout=30,
                          files={"files": ("crafted.json", json.dumps(document).encode(), "application/json")})
    path = uploaded.json()[0]
    file_data = {"path": path, "orig_name": "crafted.json", "meta": {"_type": "gradio.FileData"}}
    answer = httpx.post(url + "gradio_api/run/predict", timeout=30,
                        json={"fn_index": load, "data": [file_data, None], "session_hash": "s-loaded"})
    assert answer.status_code == 200, answer.text
    assert _mark(url, index, "s-loaded", "Crafted question", "Crafted answer").status_code == 200
    [mark] = log.marks()
    assert mark["reply"] == "Crafted answer" and mark["stats"] == {} and mark["settings"] == {}


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_mark_with_a_line_separator_survives_later_comments_and_marks(tmp_path, separator):
    log = FeedbackLog(tmp_path)
    first = log.record("down", f"line one{separator}line two", f"reply{separator}text")
    second = log.record("up", "plain", "reply")
    assert log.comment(second, f"nice{separator}really")  # rewrites the file
    assert log.comment(first, "kept")
    assert [(m["prompt"], m["comment"]) for m in log.marks()] == [
        (f"line one{separator}line two", "kept"), ("plain", f"nice{separator}really")]
    assert len(log.path.read_text(encoding="utf-8").splitlines()) == 2  # one row per line for any reader
    assert len(log.prompt_set.read_text(encoding="utf-8").splitlines()) == 2


def test_rows_written_with_a_raw_separator_are_still_read(tmp_path):
    """A row holding a raw U+2028 (as json.dumps(ensure_ascii=False) writes it) reads back whole."""
    log = FeedbackLog(tmp_path)
    row = {"id": "abc", "rating": "up", "comment": "", "prompt": "a\u2028b", "reply": "r", "settings": {}}
    log.path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [m["prompt"] for m in log.marks()] == ["a\u2028b"]
    log.record("up", "next", "r")
    assert [m["prompt"] for m in log.marks()] == ["a\u2028b", "next"]


def test_the_log_refuses_oversize_marks_with_the_limit(tmp_path):
    log = FeedbackLog(tmp_path, max_prompt_chars=10, max_reply_chars=20)
    with pytest.raises(InvalidRequestError, match="at most 10"):
        log.record("up", "p" * 11, "r")
    with pytest.raises(InvalidRequestError, match="at most 20"):
        log.record("up", "p", "r" * 21)



def test_the_comment_row_goes_with_the_chat_of_its_mark(tmp_path):
    settings = parse_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-image"],
                              env={})
    demo = ui.create_demo(Backend(settings), chat_extras=app_parts(settings).chat_extras)
    [block] = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "follow_chat"]
    chatbot = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "chatbot")
    assert (chatbot._id, "change") in [(t[0], t[1]) for t in block.targets]  # New chat, a saved chat, Clear
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": "an answer"}]}]
    kept = block.fn(chat, "an answer")
    assert all(isinstance(x, dict) and x.get("__type__") == "update" and len(x) == 1 for x in kept)  # gr.skip()
    mark_id, marked, row = block.fn([], "an answer")  # the chat of the mark is gone
    assert mark_id is None and marked is None and row["visible"] is False
    assert all(x == {"__type__": "update"} for x in block.fn([], None))  # nothing marked: nothing to do


def test_a_torn_last_line_does_not_swallow_the_next_mark(tmp_path):
    """A crash or a full disk mid-write leaves half a row; the next mark is still a row of its own."""
    log = FeedbackLog(tmp_path)
    log.record("up", "first prompt", "first reply")
    with log.path.open("ab") as f:
        f.write(b'{"id": "torn", "rating": "down", "prompt": "half a ro')  # what the crash left
    mark = log.record("down", "after the crash", "a reply")
    assert [m["prompt"] for m in log.marks()] == ["first prompt", "after the crash"]
    assert [m["id"] for m in log.marks()][-1] == mark
    assert [json.loads(line)["prompt"] for line in log.prompt_set.read_text().splitlines()] == [
        "after the crash", "first prompt"]


KILLED_MID_WRITE = """
import io, os, signal, sys
from pathlib import Path
from tools.qa.feedback import FeedbackLog

log = FeedbackLog(Path(sys.argv[1]))
log.record("up", "before the crash", "a reply")
real_open = io.open

class HalfWriter:
    # the file of the next mark: half its bytes reach the disk, then the process is killed (kill -9)
    def __init__(self, f):
        self.f = f
    def __getattr__(self, name):
        return getattr(self.f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

def open_(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    return HalfWriter(f) if str(file).endswith("marks.jsonl") and "a" in mode else f

io.open = open_
log.record("down", "killed mid-write", "the reply the visitor never saw thanked")
"""


def test_a_process_killed_mid_write_loses_only_its_own_mark(tmp_path):
    """kill -9 in the middle of writing a mark: every earlier mark and the next mark are kept."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)], cwd=root, timeout=120,
                           capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    log = FeedbackLog(tmp_path)
    assert not log.path.read_bytes().endswith(b"\n")  # the torn tail the kill left
    log.record("up", "after the restart", "a reply")
    assert [m["prompt"] for m in log.marks()] == ["before the crash", "after the restart"]


@pytest.mark.slow
def test_fresh_sessions_do_not_reset_an_addresss_budget(served):
    """Marks are budgeted per client address too: new Gradio sessions from one address stop at its budget."""
    url, index, log = served
    codes = [_mark(url, index, f"fresh-{n}", f"q{n}", "a").status_code for n in range(MAX_MARKS_PER_CLIENT)]
    assert codes == [200] * MAX_MARKS_PER_CLIENT  # one session each: the session cap never bites
    refused = _mark(url, index, "yet-another", "one more", "a")
    assert refused.status_code == 500
    assert refused.json()["error"] == (f"Your address has stored {MAX_MARKS_PER_CLIENT} marks in the last hour, the "
                                       "most one visitor may store; this one was not stored.")
    assert len(log.marks()) == MAX_MARKS_PER_CLIENT


def test_a_global_rate_bounds_marks_from_all_clients_and_a_client_budget_each(tmp_path):
    now = [1000.0]
    log = FeedbackLog(tmp_path, per_client=3, per_minute=5, clock=lambda: now[0])
    for n in range(5):
        log.record("up", f"prompt {n}", "a", client=f"10.0.0.{n}")
    with pytest.raises(InvalidRequestError, match="at most 5 marks a minute from all visitors together"):
        log.record("up", "the sixth in a minute", "a", client="10.0.0.9")
    now[0] += 61
    for n in range(2):
        log.record("down", f"later {n}", "a", client="10.0.0.0")
    with pytest.raises(InvalidRequestError, match="Your address has stored 3 marks in the last hour"):
        log.record("down", "a fourth this hour", "a", client="10.0.0.0")
    log.record("down", "another address", "a", client="10.0.0.1")
    now[0] += 3601
    log.record("down", "an hour later", "a", client="10.0.0.0")
    assert len(log.marks()) == 9


def test_anonymous_marks_never_push_reviewed_prompts_out_of_the_prompt_set(tmp_path):
    log = FeedbackLog(tmp_path, per_minute=10_000)
    reviewed = [{"prompt": "What is a NEFF?"}, {"prompt": "Explain the KV cache.", "greedy": True}]
    log.reviewed.write_text("".join(json.dumps(r) + "\n" for r in reviewed), encoding="utf-8")
    for n in range(MAX_QA_PROMPTS + 20):
        log.record("down", f"attacker prompt {n}", "a", client=f"10.1.{n // 256}.{n % 256}")
    rows = [json.loads(line) for line in log.prompt_set.read_text().split("\n") if line]
    assert len(rows) == MAX_QA_PROMPTS and rows[:2] == reviewed
    assert rows[2]["prompt"] == f"attacker prompt {MAX_QA_PROMPTS + 19}"  # the newest marks fill the rest
