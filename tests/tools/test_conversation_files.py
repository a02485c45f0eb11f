"""Conversation files as a plug-in: the export document (reasoning, notices, settings, each reply's stats) and its
checks on load, the Markdown export (English on either page), a loaded file refused plainly and in Arabic; the
Chat tab without the plug-in has no Export / Load row, with it the row stands under the feedback row. The page's
buttons in a browser: tests/browser/test_browser.py; a loaded reply's stats never reach a 👍/👎 mark:
tests/tools/test_feedback.py.
"""

from __future__ import annotations

import json

import pytest
from support.app import app_parts, app_settings
from support.chat_stats import chat_stats as _stats
from support.i18n_check import arabic_text, refused_in_both_languages

import ui
from app import PLUGINS
from neuron_backend.chat.text import ChatStats, HistoryLimits, normalize_history
from neuron_backend.errors import InvalidRequestError
from neuron_backend.runtime import Backend
from tools.conversation_files import plugin
from tools.conversation_files.document import export_document, load_document
from tools.conversation_files.markdown import conversation_markdown
from tools.conversation_files.row import read_conversation
from ui.i18n import localized, speaking

ALLOWED = ("Qwen",)  # Latin beside Arabic


def _arabic(text: str, allowed: tuple[str, ...] = ALLOWED) -> str:
    return arabic_text(text, allowed)


# -- the plug-in's seam -------------------------------------------------------------------------------

def _page(tmp_path, with_plug_in: bool):
    """The Chat tab of the tiny chat model, with every other plug-in's rows, with or without this plug-in's."""
    settings = app_settings(["--models", "tiny", "--device", "cpu", "--cache-dir", str(tmp_path), "--no-image"])
    extras = [e for p in PLUGINS if with_plug_in or p is not plugin for e in p.plug(settings).chat_extras]
    assert len(app_parts(settings).chat_extras) == len(extras) + (0 if with_plug_in else 1)
    return ui.create_demo(Backend(settings), chat_extras=extras)


def _element(demo, elem_id):
    return next((b for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id), None)


FILE_IDS = ("export-json", "export-md", "load-json", "export-file")


def test_the_core_alone_has_no_export_or_load_and_the_plug_in_puts_them_where_they_stood(tmp_path):
    assert plugin in PLUGINS and plugin.plug(None).chat_extras  # app.py serves it; no flags to read
    bare = _page(tmp_path, with_plug_in=False)
    assert _element(bare, "chatbot") is not None and _element(bare, "feedback-row") is not None
    assert all(_element(bare, i) is None for i in FILE_IDS)
    assert not [f for f in bare.fns.values() if f.name in ("export_json", "export_markdown", "load_conversation")]

    page = _page(tmp_path, with_plug_in=True)
    assert all(_element(page, i) is not None for i in FILE_IDS)
    # under the chat, after the feedback row: the row, then the file, last in the tab's column
    feedback, row, export_file = _element(page, "feedback-row"), _element(page, "export-json").parent, \
        _element(page, "export-file")
    column = row.parent
    assert feedback.parent is column and export_file.parent is column
    assert column.children[-3:] == [feedback, row, export_file]
    # a loaded conversation clears the stats line and the context meter, as the tab's Clear does
    [load] = [i for i, f in page.fns.items() if f.name == "load_conversation"]
    [after] = [f for f in page.fns.values() if f.name == "forget_stats" and f.trigger_after == load]
    assert after.trigger_only_on_success and [o.elem_id for o in after.outputs] == ["chat-stats", "context-meter"]
    assert len(page.fns[load].outputs) == 10  # the chat, its 8 controls, the reply records


# -- the export document ------------------------------------------------------------------------------

def test_one_normaliser_for_the_ui_and_the_api():
    limits = HistoryLimits()
    ui = [{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
          {"role": "assistant", "content": "thinking hard", "metadata": {"title": "💭 Reasoning", "status": "done"}},
          {"role": "assistant", "content": "  indented\n\n", "metadata": None, "options": []},
          {"role": "assistant", "content": "Raise it.", "metadata": {"title": "⚠ Stopped at the limit"}}]
    plain = normalize_history(ui, limits)
    assert plain == ({"role": "user", "content": "hi there"}, {"role": "assistant", "content": "  indented\n\n"})
    document = export_document(ui, model="m", system_prompt="s", settings={"thinking": True, "seed": 3})
    assert normalize_history(document["messages"], limits) == plain  # the export goes straight into /chat
    assert normalize_history(document, limits) == plain
    assert document["messages"][1]["reasoning"] == "thinking hard"
    assert document["messages"][1]["notices"] == ["Stopped at the limit. Raise it."]


def test_export_document_round_trips_with_stats():
    stats = {"new_tokens": 5, "seed": 11, "finish_reason": "eos", "time_to_first_token_s": 0.1}
    ui = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    document = export_document(ui, model="Qwen/Qwen3-0.6B", system_prompt="sys",
                               settings={"temperature": 0.5, "seed": -1, "junk": 1},
                               stats_of=lambda answer: stats if answer == "a" else None)
    assert document["format"] == "trainium-showcase-chat" and document["version"] == 1
    assert document["settings"] == {"temperature": 0.5, "seed": -1}
    assert document["messages"][1]["stats"] == stats
    loaded = load_document(json.loads(json.dumps(document)), HistoryLimits())
    assert loaded["system_prompt"] == "sys" and loaded["messages"] == document["messages"]
    with pytest.raises(InvalidRequestError, match="not a conversation exported by this app"):
        load_document([1, 2], HistoryLimits())
    with pytest.raises(InvalidRequestError, match="version 9 is not supported"):
        load_document({**document, "version": 9}, HistoryLimits())
    with pytest.raises(InvalidRequestError, match="at most 1"):
        load_document(document, HistoryLimits(messages=1))


def test_markdown_export_reads_as_a_conversation():
    stats = vars(ChatStats(10, 32, 7, 0.25, 20.0, 0.5, 0, 0, 256, 64, False, "length", seed=42))
    document = export_document(
        [{"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "pondering\n\nmore", "metadata": {"title": "💭 Reasoning"}},
         {"role": "assistant", "content": "Hello **there**"}],
        model="Qwen/Qwen3-0.6B", system_prompt="Be brief.", settings={"thinking": True},
        stats_of=lambda answer: stats)
    markdown = conversation_markdown(document)
    assert markdown.startswith("# Conversation with Qwen/Qwen3-0.6B")
    assert "## You\n\nHi\n" in markdown and "## Assistant\n\n> 💭 **Reasoning**\n>\n> pondering\n>\n> more" in markdown
    assert "Hello **there**" in markdown and "seed 42" in markdown and "cut at the 64-token limit" in markdown
    assert "**System prompt:**\n\n> Be brief." in markdown and '"type"' not in markdown


def test_markdown_export_writes_switches_as_on_off_and_no_live_html():
    document = export_document(
        [{"role": "user", "content": 'look <img src=x onerror="alert(1)"> and ![p](http://x/p.png)'},
         {"role": "assistant", "content": "<b>bold?</b> `<kept>`"}],
        model="m", system_prompt="<script>x()</script>", settings={"thinking": True, "greedy": False, "top_k": 20})
    markdown = conversation_markdown(document)
    assert "thinking on, greedy off, top_k 20" in markdown and "True" not in markdown and "False" not in markdown
    assert '\\<img src=x onerror="alert(1)">' in markdown and "\\![p](http\\://x/p.png)" in markdown
    assert "\\<b>bold?\\</b> `<kept>`" in markdown and "> \\<script>x()\\</script>" in markdown
    assert "<img" not in markdown.replace("\\<img", "") and "<b>" not in markdown.replace("\\<b>", "")


def test_the_markdown_export_stays_english_on_an_arabic_page():
    stats = vars(_stats(finish_reason="length"))
    history = [{"role": "user", "content": "مرحبا"},
               {"role": "assistant", "content": "أفكر", "metadata": {"title": "💭 الاستدلال"}},
               {"role": "assistant", "content": "أهلًا"}]
    with speaking("ar"):
        document = export_document(history, model="demo", system_prompt=None, settings={}, stats_of=lambda a: stats)
        markdown = conversation_markdown(document)
    assert document["messages"][1]["reasoning"] == "أفكر"  # the Arabic reasoning bubble is known as one
    assert "## Assistant\n\n> 💭 **Reasoning**\n>\n> أفكر" in markdown
    assert "s to first token" in markdown and "cut at the 40-token limit" in markdown


# -- a loaded file, refused plainly and in Arabic -----------------------------------------------------

HISTORY_ITEM = {"role": "user", "content": "hello"}
DOCUMENT = export_document([HISTORY_ITEM], model="m", system_prompt=None, settings={})

LOAD_ERRORS = {
    "This file is not a conversation exported by this app (its \"format\" must be {format}).":
        lambda: load_document([1], HistoryLimits()),
    "Conversation export version {version} is not supported; this app reads version {supported}.":
        lambda: load_document({**DOCUMENT, "version": 9}, HistoryLimits()),
}


@pytest.mark.parametrize("key", sorted(LOAD_ERRORS))
def test_load_errors_in_arabic(key):
    refused_in_both_languages(LOAD_ERRORS[key], key, ALLOWED)


def test_a_conversation_file_refused_in_arabic(tmp_path):
    limits = HistoryLimits(messages=4, chars=10, message_chars=10)
    big, broken = tmp_path / "big.json", tmp_path / "broken.json"
    big.write_text(" " * 1_000_100)
    broken.write_text("{not json")
    for path, key in ((big, "The file is {size} bytes; a conversation file may be at most {limit} bytes."),
                      (broken, "The file is not a JSON conversation export ({error}).")):
        with pytest.raises(InvalidRequestError) as raised:
            read_conversation(str(path), limits)
        assert raised.value.args[0].template == key
        with speaking("ar"):
            _arabic(localized(raised.value), allowed=("JSON",))
    (tmp_path / "ok.json").write_text(json.dumps(DOCUMENT))
    assert read_conversation(str(tmp_path / "ok.json"), limits)["messages"][0]["content"] == "hello"


@pytest.mark.parametrize(("text", "reason"), [
    ("[" * 100_000 + "]" * 100_000, "its JSON is nested deeper than an export ever is"),
    ('{"format": "trainium-showcase-chat", "version": ' + "5" * 5000 + "}", "it holds a number of over 4300 digits"),
    ("{not json", "it is not valid JSON"),
], ids=["nested", "huge number", "not JSON"])
def test_a_conversation_file_that_is_not_json_says_so_plainly(tmp_path, text, reason):
    path = tmp_path / "conversation.json"
    path.write_text(text)
    with pytest.raises(InvalidRequestError) as raised:
        read_conversation(str(path), HistoryLimits())
    assert str(raised.value) == f"The file is not a JSON conversation export ({reason})."
    (tmp_path / "latin-1.json").write_bytes(b'{"messages": "caf\xe9"}')
    with pytest.raises(InvalidRequestError, match=r"\(it is not UTF-8 text\)"):
        read_conversation(str(tmp_path / "latin-1.json"), HistoryLimits())
