"""The Chat tab in Arabic: what the page builds at run time (stats line, context meter,
reply notices, refusal notes, toasts) and the chat backend's messages come in the page's language;
English (API clients, logs, a page in English) is exactly what it was.

Backend errors are triggered through the real code (request checks, history, prompt, engine,
feedback) and read with ``localized`` under ``speaking("ar")``.
The browser test sends a message to the demo chat model from a page in Arabic.
"""

from __future__ import annotations

import re
import threading

import pytest
from support.app import warm_backend
from support.chat_stats import chat_stats as _stats
from support.i18n_check import arabic_text, has_arabic, refused_in_both_languages

from neuron_backend.chat.text import (
    REASONING_TITLE,
    ChatRequest,
    ChatUpdate,
    HistoryLimits,
    normalize_request,
    reply_notices,
)
from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import LANGUAGES
from neuron_backend.shapes import PromptBucket
from tools.qa.feedback import FeedbackLog
from ui.i18n import localized, say, speaking
from ui.presentation import (
    chat_stats_text,
    context_meter_text,
    markdown_literal,
    markdown_unliteral,
)

# Names that stay Latin beside Arabic: the model's maker (the greedy advice quotes its card).
ALLOWED = ("Qwen",)


def _arabic(text: str, allowed: tuple[str, ...] = ALLOWED) -> str:
    return arabic_text(text, allowed)


# ----- text the page builds -------------------------------------------------------------------------
def test_stats_line_in_both_languages():
    plain, busy = _stats(), _stats(compiled_graphs=1, stopped=True, finish_reason="length", seed=None)
    assert chat_stats_text(plain) == "0.12 s to first token · 35.1 tokens/s · 40 new tokens · seed 7 · no compile"
    assert chat_stats_text(vars(busy)) == ("0.12 s to first token · 35.1 tokens/s · 40 new tokens · ⚠ compiled a "
                                           "graph · stopped · cut at the 40-token limit")
    with speaking("ar"):
        for stats in (plain, busy, vars(plain), _stats(time_to_first_token_s=None)):
            text = _arabic(chat_stats_text(stats))
            assert "35.1" in text or "?" in text
        assert "البذرة 7" in chat_stats_text(plain) and "40" in chat_stats_text(busy)
        assert chat_stats_text(None) == ""


def test_context_meter_in_both_languages():
    dropped = _stats(dropped_turns=3)
    assert context_meter_text(None, (32, 64), 256) == "Context: prompt buckets 32, 64 tokens · cache 256 tokens"
    assert context_meter_text(dropped, (32, 64), 256) == (
        "Context: prompt 12/64 tokens (bucket) · 52/256 tokens of cache · ⚠ 3 oldest turn(s) dropped to fit the "
        "64-token limit")
    with speaking("ar"):
        assert "32, 64" in _arabic(context_meter_text(None, (32, 64), 256))
        text = _arabic(context_meter_text(dropped, (32, 64), 256))
        assert "12/64" in text and "52/256" in text and "3" in text


def test_the_idle_meter_carries_both_languages():
    from types import SimpleNamespace

    from ui.chat_tab import idle_meter

    text = idle_meter(SimpleNamespace(buckets=(32, 64), context_length=256))
    english, arabic = re.findall(r"<span[^>]*>([^<]*)</span>", text)
    assert english == "Context: prompt buckets 32, 64 tokens · cache 256 tokens"
    _arabic(arabic)
    assert '<span class="i18n-ar" lang="ar">' in text  # ui/i18n.py CSS shows the one of <html lang>


def test_an_empty_reply_says_so_and_a_stopped_one_does_not():
    from ui.chat_tab import reply_messages

    empty = ChatUpdate("", "", "", True, _stats(finish_reason="eos"))
    bubbles = reply_messages(empty, ChatRequest("q"))
    assert len(bubbles) == 2 and bubbles[0].content == ""  # the answer (history), then the note (never fed back)
    assert bubbles[-1].metadata["title"] == "⚠ The model produced no text"
    assert bubbles[-1].content.startswith("It ended the reply at its first token: send the message again")
    with speaking("ar"):
        note = reply_messages(empty, ChatRequest("q"))[-1]
    _arabic(note.metadata["title"])
    _arabic(note.content)
    stopped = ChatUpdate("", "", "", True, _stats(finish_reason="stopped", stopped=True))
    assert len(reply_messages(stopped, ChatRequest("q"))) == 1  # "stopped" is in its stats line
    assert len(reply_messages(ChatUpdate("", "", "", False, None), ChatRequest("q"))) == 1  # not done yet


def test_a_stop_keeps_the_reply_so_far_or_says_it_stopped_before_any_text():
    from ui.chat_tab import stopped_history

    before = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
              {"role": "user", "content": [{"type": "text", "text": "tell me"}]}]
    stopped = ChatUpdate("", "", "", True, _stats(finish_reason="stopped", stopped=True, new_tokens=2))
    shown = stopped_history(before, stopped)  # no text at all: a note where the reply would be
    assert shown[:3] == before and len(shown) == 4
    assert shown[3].metadata["title"] == "⏹ Stopped before any text"
    assert shown[3].content == "Retry sends the message again."
    with speaking("ar"):
        note = stopped_history(before, None)[-1]  # the stats never came: the note too
    _arabic(note.metadata["title"])
    _arabic(note.content)
    words = ChatUpdate("once upon", "", "", True, _stats(finish_reason="stopped", stopped=True))
    streamed = [*before, {"role": "assistant", "content": "once"}]
    assert [m.content for m in stopped_history(streamed, words)[3:]] == ["once upon"]  # the final text
    assert stopped_history(streamed, None) == streamed  # what the page showed, when no final update came


def test_reply_bubbles_and_notices_in_the_page_language():
    from ui.chat_tab import reply_messages

    cut = ChatUpdate("still weighing", "", "", True, _stats(finish_reason="length", max_new_tokens=8))
    request = ChatRequest("q", thinking=True, greedy=True)
    english = reply_messages(cut, request)
    assert [m.metadata["title"] for m in english] == [
        "💭 Reasoning", "⚠ Stopped at the limit of 8 new tokens, while still reasoning: no answer yet",
        "⚠ Greedy decoding with thinking on"]
    assert english[1].content.startswith("Raise max_new_tokens for a longer reply (reasoning often")
    with speaking("ar"):
        shown = reply_messages(cut, request)
    assert shown[0].metadata["title"] in {REASONING_TITLE.text(language) for language in LANGUAGES} \
        and shown[0].content == "still weighing"
    for bubble in shown[1:]:
        _arabic(bubble.metadata["title"])
        _arabic(bubble.content)
    assert "8" in shown[1].metadata["title"] and "max_new_tokens" in shown[1].content
    # /chat's notices (str) stay English whatever the page shows
    notices = [str(n) for n in reply_notices(cut, request)]
    assert notices[0] == ("Stopped at the limit of 8 new tokens, while still reasoning: no answer yet. Raise "
                          "max_new_tokens for a longer reply (reasoning often takes many more tokens than the "
                          "answer), or turn thinking off.")
    with speaking("ar"):
        assert [str(n) for n in reply_notices(cut, request)] == notices


def test_a_refusal_note_and_its_toast_in_the_page_language():
    from ui.chat_tab import chat_refusals

    @chat_refusals(lambda: 2)
    def handler(message):
        yield from ()
        normalize_request(ChatRequest(message), 10, 8)

    for language, title in (("en", "⚠ Not answered"), ("ar", None)):
        with speaking(language), pytest.warns(UserWarning) as toasts:  # gr.Warning outside an event warns
            [(note, *rest)] = list(handler("x" * 11))
        assert len(rest) == 2 and len(note) == 1  # the other outputs are left as they are
        if title:
            assert note[0].metadata["title"] == title
            assert note[0].content == "The message is 11 characters; at most 10 are allowed."
        else:
            _arabic(note[0].metadata["title"])
            assert "11" in _arabic(note[0].content) and "10" in note[0].content
            assert any(has_arabic(str(t.message)) for t in toasts)


def test_feedback_toasts_in_arabic():
    with speaking("ar"):
        assert "👍" in _arabic(say("Thanks: reply marked {mark}. Add a comment below if you like.", mark="👍"))
        _arabic(say("Comment saved."))
    thanks = say("Thanks: reply marked {mark}. Add a comment below if you like.", mark="👎")
    assert thanks == "Thanks: reply marked 👎. Add a comment below if you like."


# ----- the backend's messages, through the code that raises them --------------------------------------
def _request(**fields):
    return lambda: normalize_request({"message": "hi", **fields}, 100, 64, history_limits=HistoryLimits(4, 50, 100))


HISTORY_ITEM = {"role": "user", "content": "hello"}
REQUEST_ERRORS = {
    "Chat request fields {fields} are not valid; allowed: {allowed} (message is required).":
        lambda: normalize_request({"message": "hi", "nope": 1}, 100, 64),
    "A chat request must be a ChatRequest or a dict of its fields.": lambda: normalize_request(["hi"], 100, 64),
    "The message is empty: type something to send.": _request(message="   "),
    "{name} must be true or false, not {value}.": _request(thinking="yes"),
    "{refusal} {hint}": _request(temperature=5),  # out of range, and what to use for the likeliest token
    "{name} {value} is out of range: use a number above {low} and at most {high}.": _request(top_p=0),
    "{name} must be a number above {low} and at most {high}, not {value}.": _request(top_p=float("nan")),
    "{name} must be a whole number from {low} to {high}, not {value}.":
        _request(seed=10**50),  # its value: "a whole number of about 51 digits"
    "{name} {value} is out of range: use a whole number from {low} to {high}.": _request(top_k=-1),
    "{what} must be text, got {kind}.": _request(message=5),
    "{what} is {length} characters; at most {limit} are allowed.": _request(system_prompt="x" * 101),
    "{what} holds a lone surrogate ({char}) at character {at}, which is not valid Unicode; send UTF-8 text.":
        _request(message="a\ud800b"),
    "{where} has a part of type {kind}; only text parts are accepted.":
        _request(history=[{"role": "user", "content": [{"type": "image", "url": "x"}]}]),
    "{where} must be text or a list of text parts, got {kind}.": _request(history=[{"role": "user", "content": 5}]),
    "The history must be {allowed}; got {kind}.": _request(history="hello"),
    "The history has {count} messages; this server accepts at most {limit}. Send only the newest ones (old turns that "
    "do not fit the prompt are dropped anyway).":
        _request(history=[HISTORY_ITEM] * 5),
    "History item {index} is not valid: it must be {allowed}.": _request(history=[{"role": "robot", "content": "x"}]),
    "The history holds more than {limit} characters; this server accepts at most {limit}. Send only the newest "
    "messages.":
        _request(history=[{"role": "user", "content": "x" * 30}] * 2),
}


@pytest.mark.parametrize("key", sorted(REQUEST_ERRORS))
def test_request_and_history_errors_in_arabic(key):
    refused_in_both_languages(REQUEST_ERRORS[key], key, ALLOWED)


def test_english_of_the_request_errors_is_unchanged():
    expected = {
        "{refusal} {hint}":
            "temperature 5 is out of range: use a number from 0.01 to 2. For the most likely token every time, "
            "use greedy.",
        "{name} must be a whole number from {low} to {high}, not {value}.":
            "seed must be a whole number from 0 to 4294967295, not a whole number of about 51 digits.",
        "{what} holds a lone surrogate ({char}) at character {at}, which is not valid Unicode; send UTF-8 text.":
            "The message holds a lone surrogate ('\\ud800') at character 1, which is not valid "
                              "Unicode; send UTF-8 text.",
        "The history must be {allowed}; got {kind}.":
            'The history must be a list of {"role": "user" or "assistant", "content": text or a '
                                 'list of text parts}, oldest first (an exported conversation\'s "messages" work '
                                 'as they are); got str.',
        "{where} has a part of type {kind}; only text parts are accepted.":
            "The content of history item 0 has a part of type 'image'; only text parts are "
                              "accepted.",
    }
    for key, english in expected.items():
        with pytest.raises(InvalidRequestError) as raised:
            REQUEST_ERRORS[key]()
        assert str(raised.value) == english


def test_feedback_errors_in_arabic(tmp_path):
    log = FeedbackLog(tmp_path, max_bytes=300)
    attempts = {"Feedback rating {rating} is not one of {allowed}.": lambda: log.record("meh", "q", "a"),
                "Only a reply to a user message can be marked.": lambda: log.record("up", " ", "a"),
                "This mark is larger than the feedback file may grow ({limit} bytes, --feedback-max-bytes); it was "
                "not stored.":
                    lambda: log.record("up", "q", "a" * 400),
                "The comment is {length} characters; at most {limit} are allowed.":
                    lambda: log.comment("id", "x" * 2001)}
    for key, attempt in attempts.items():
        with pytest.raises(InvalidRequestError) as raised:
            attempt()
        assert raised.value.args[0].template == key
        with speaking("ar"):
            _arabic(localized(raised.value))
    assert str(raised.value) == "The comment is 2001 characters; at most 2000 are allowed."


def test_engine_errors_and_shape_labels_in_arabic(tiny_settings, demo_models):
    from neuron_backend.chat.engine import ChatEngine
    from neuron_backend.devices import HostDevices, resolve_placements
    from neuron_backend.errors import EngineUnavailableError, PromptTooLongError

    cpu_only = HostDevices(neuron_cores=0, cuda_devices=0)
    engine = ChatEngine(tiny_settings, resolve_placements(tiny_settings, cpu_only)["chat"], "demo Qwen3")
    with pytest.raises(EngineUnavailableError) as not_loaded:
        engine.stream(ChatRequest("hi"))
    engine.load(demo_models.chat)
    with pytest.raises(PromptTooLongError) as too_long:
        engine.stream(ChatRequest("the quiet river " * 60, system_prompt="be brief"))
    with pytest.raises(InvalidRequestError) as unknown:
        engine.warm_up(PromptBucket(7))
    assert "Shorten the message or the system prompt" in str(too_long.value)
    info = engine.count_prompt_tokens({"message": "the quiet river " * 60})
    with speaking("ar"):
        for error in (not_loaded.value, too_long.value, unknown.value):
            _arabic(localized(error))
        _arabic(localized(info.problem))
        labels = {key: _arabic(localized(label)) for key, label in engine.shape_labels.items()}
    first = engine.shape_labels[PromptBucket(32)]
    assert first.startswith("prompt bucket 32 tokens, ") and "+ the decode graphs (cache 256 tokens" in first
    assert "32" in labels[PromptBucket(32)] and "256" in labels[PromptBucket(32)]


def test_chat_refusals_pass_other_errors_through():
    from ui.chat_tab import chat_refusals

    @chat_refusals(lambda: 0)
    def handler():
        yield from ()
        raise RuntimeError("not a refusal")

    with pytest.raises(RuntimeError):
        list(handler())


# ----- chat text and stopped replies ---------------------------------------------------------------
LITERAL = ["List<String>", "if a<b and c>d", "<unknown-tag>inside</unknown-tag>",
           '<div style="background-image:url(http://127.0.0.1:9/x)">x</div>', "AT&T &amp; co", "a \\<b> c \\\\<d",
           "code `List<T>` and\n```java\nList<String> x;\n```\nafter <b>", "```\nunclosed <a href=x>"]


@pytest.mark.parametrize("text", LITERAL)
def test_chat_text_is_escaped_outside_code_and_round_trips(text):
    escaped = markdown_literal(text)
    assert markdown_unliteral(escaped) == text
    outside = escaped.split("```")[0].split("`")[0]
    assert "<" not in outside.replace("\\<", "") and "&" not in outside.replace("\\&", "")


# GFM's bare-URL autolinks take every character up to a space or "<" (a backslash before "<" too), and an
# image fetches its URL: the escaped text starts neither (the browser's view: tests/browser/test_live_text.py).
# An image's "!" is live after an even number of backslashes.
STARTS_LIVE = re.compile(r"(?i)(?:ftp|https?)://|www\.|(?<!\\)(?:\\\\)*!\[")


@pytest.mark.parametrize("text", ["see http://x/<img src=http://x/a.png> end", "HTTPS://x/\\<b>", "www.x.org/<i>",
                                  "![a](http://x/i.png)", "\\![a][r]\n\n[r]: ftp://x/i.png", "http\\://x a.b: c"])
def test_chat_text_starts_no_autolink_and_no_image(text):
    escaped = markdown_literal(text)
    assert markdown_unliteral(escaped) == text
    assert not STARTS_LIVE.search(escaped), escaped


def test_chatbot_sends_escaped_text_and_hands_back_the_original():
    from ui.chat_tab import LiteralChatbot

    bot = LiteralChatbot(render=False)
    sent = bot.postprocess([{"role": "user", "content": "List<String>  \n    indented"}])
    assert sent.root[0].content[0].text == "List\\<String>  \n    indented"  # no cleandoc, nothing live
    back = bot.preprocess(sent)
    assert back[0]["content"][0]["text"] == "List<String>  \n    indented"


@pytest.mark.slow
def test_a_stopped_reply_keeps_its_stats(tmp_path, demo_models):
    """Closing the reply (Gradio's Stop) still yields the final stats, marked stopped."""
    from neuron_backend.chat.text import ChatRequest
    from ui.chat_tab import StoppedReplies

    backend = warm_backend(tmp_path, demo_models, "--no-image")
    replies = StoppedReplies(backend)
    stream = replies.stream("session-1", ChatRequest(message="long story", greedy=True, max_new_tokens=200))
    first = [next(stream) for _ in range(3)]
    assert not first[-1].done
    stream.close()  # what Gradio does on Stop
    final = replies.stopped("session-1")
    assert final is not None and final.done and final.stats.stopped and final.stats.finish_reason == "stopped"
    assert 1 <= final.stats.new_tokens < 200 and final.answer.startswith(first[-1].answer)
    assert not backend.engine("chat").busy
    assert replies.stopped("session-1") is None  # shown once
    assert replies.stopped("another session") is None


def test_a_stop_as_the_reply_ends_keeps_the_replys_stats():
    """Gradio's Stop can close the reply right at its final update (the reply ended as Stop was pressed): the
    page never showed that update, so the Stop's listener gets it, stats and all (not marked stopped)."""
    from types import SimpleNamespace

    from ui.chat_tab import StoppedReplies

    final = SimpleNamespace(answer="hello world", done=True, stats=SimpleNamespace(stopped=False))
    backend = SimpleNamespace(chat_slots=lambda: 1, cancel=lambda engine: None,
                              stream_chat=lambda request, stop: iter([SimpleNamespace(answer="hello", stats=None),
                                                                       final]))
    replies = StoppedReplies(backend, wait_s=0)
    stream = replies.stream("me", request=None)
    assert [next(stream), next(stream)][-1] is final
    stream.close()  # the Stop: the consumer is closed at the final update, before it showed it
    assert replies.stopped("me") is final


@pytest.mark.slow
def test_a_stopped_reply_keeps_its_stats_with_chat_batch_and_the_other_reply_runs_on(tmp_path, demo_models):
    """With --chat-batch 2, Stop ends only that reply's row: it keeps its stats, the other user's reply goes on."""
    from neuron_backend.chat.text import ChatRequest
    from tools.chat_batch import plugin as chat_batch
    from tools.chat_batch.batch import BatchRow, Sampling
    from ui.chat_tab import StoppedReplies

    backend = warm_backend(tmp_path, demo_models, "--no-image", "--chat-batch", "2", "--max-new-tokens", "2000",
                           plugins=(chat_batch,))
    replies = StoppedReplies(backend)
    # 2000 tokens: a few seconds on the demo model, so the stop lands mid-reply (200 could end before it)
    request = ChatRequest(message="long story", greedy=True, max_new_tokens=2000)
    mine, theirs = replies.stream("me", request), replies.stream("them", request)
    # Both submitted at once, so they share one batch (a request that comes while a batch runs waits for it).
    started = threading.Thread(target=next, args=(theirs,))
    started.start()
    first = [next(mine) for _ in range(3)]
    started.join(10)
    assert not first[-1].done
    mine.close()  # what Gradio does on Stop
    final = replies.stopped("me")
    assert final is not None and final.done and final.stats.stopped and final.stats.finish_reason == "stopped"
    assert 1 <= final.stats.new_tokens < 2000 and final.stats.batch_size == 2
    rest = list(theirs)  # the other reply ran on to its own end, in the same batch
    assert rest[-1].done and rest[-1].stats.batch_size == 2 and not rest[-1].stats.stopped
    assert rest[-1].stats.new_tokens > final.stats.new_tokens
    # A row stopped before its turn ends with a result (no tokens), not a wait for a batch that never comes.
    scheduler = backend.engine("chat").runner().scheduler
    row = BatchRow([1, 2, 3], 32, 5, Sampling(greedy=True))
    row.cancel.set()
    scheduler.submit(row)
    assert list(scheduler.follow(row)) == [] and row.result.finish_reason == "stopped" and row.result.new_ids == []
