"""The English/Arabic string table (ui/i18n.py): every key the UI uses exists in both languages, no
component is given a literal label any more, and the ?lang= override reaches the page's <head> first."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

import tools.cache.panel  # noqa: F401 - registers the bundles' messages
import tools.qa.tab  # noqa: F401 - registers the QA bench's words and messages
from ui import i18n

ROOT = Path(__file__).resolve().parents[1]
UI = ROOT / "ui"
QA = ROOT / "tools" / "qa"  # the annex's tab registers its words (tools/qa/words.py)
# Parameters that the page shows as static text; a str literal there bypasses the table.
SHOWN = {"label", "info", "placeholder", "examples_label"}
# Components whose first positional argument is shown text (a button's value, a tab's or accordion's title).
TITLED = {"Button", "UploadButton", "Accordion", "Tab", "Markdown"}
# The files that build what the page shows (api.py's hidden components are named for API clients).
PAGE_FILES = ["__init__.py", "status_panel.py", "header.py", "chat_tab.py", "chat_saved.py", "chat_view.py",
              "chat_export.py", "image_tab.py", "../tools/qa/tab.py", "../tools/qa/views.py",
              "../tools/cache/panel.py"]


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            yield node


def _is_t(node: ast.Call) -> bool:
    """t("key") for a component's text, say("key", ...) for text built at run time."""
    return isinstance(node.func, ast.Name) and node.func.id in ("t", "say")


def _used_keys() -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for path in sorted([*UI.glob("*.py"), QA / "tab.py", QA / "views.py", ROOT / "tools" / "cache" / "panel.py"]):
        for call in _calls(path):
            if not _is_t(call) or not call.args:
                continue
            arg = call.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                keys.setdefault(arg.value, []).append(f"{path.name}:{call.lineno}")
            elif isinstance(arg, ast.JoinedStr):  # t(f"qa_mark_{m}"): the constant head must name a family
                head = "".join(v.value for v in arg.values if isinstance(v, ast.Constant))
                assert any(k.startswith(head) for k in i18n.TABLE), f"{path.name}:{call.lineno}: {head}*"
    return keys


def test_every_key_used_in_ui_exists_in_both_languages():
    used = _used_keys()
    assert len(used) >= 60, sorted(used)  # the walk finds the tabs' calls (a broken walk finds none)
    missing = {k: where for k, where in used.items() if k not in i18n.TABLE}
    assert not missing, f"keys used but not in ui/texts/ or neuron_backend/texts/: {missing}"
    for key, (english, arabic) in {**i18n.STRINGS, **i18n.GRADIO_STRINGS}.items():
        assert english.strip() and arabic.strip(), key
    assert i18n.I18N.translations_dict["ar"]["chat_interface.new_chat"] == "محادثة جديدة"  # Gradio's own key
    assert "chat_interface.new_chat" not in i18n.I18N.translations_dict["en"]  # English keeps Gradio's
    with pytest.raises(KeyError, match="no string 'nope'"):
        i18n.t("nope")


def test_arabic_texts_are_arabic_where_the_english_has_words():
    latin_only = {"chat_top_p", "chat_top_k", "chat_chatbot"}  # parameter and model names stay Latin
    for key, (english, arabic) in i18n.STRINGS.items():
        if key in latin_only:
            assert arabic == english, key
        else:
            assert any("\u0600" <= ch <= "\u06ff" for ch in arabic), (key, arabic)


def test_no_component_gets_a_literal_label():
    literal = []
    for path in (UI / name for name in PAGE_FILES):
        for call in _calls(path):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if not name[:1].isupper() and name != "update":
                continue
            shown = [kw.value for kw in call.keywords if kw.arg in SHOWN]
            if name in TITLED and call.args:
                shown.append(call.args[0])
            literal += [f"{path.name}:{call.lineno} {name}({v.value!r})" for v in shown
                        if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    assert not literal, "shown text not from ui/i18n.py: " + "; ".join(literal)


def test_bilingual_html_escapes_and_marks_both_languages():
    text = i18n.bilingual_html("header_title")
    assert '<span class="i18n-en">Hugging Face models on AWS Trainium</span>' in text
    assert '<span class="i18n-ar" lang="ar">نماذج Hugging Face على AWS Trainium</span>' in text
    assert "PyTorch's" in i18n.bilingual_html("header_summary")  # text, not an attribute: quotes stay


def _run_override(path: str, query: bytes, content_type: bytes, body: bytes, method: str = "GET") -> list[dict]:
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
        half = len(body) // 2
        await send({"type": "http.response.body", "body": body[:half], "more_body": True})
        await send({"type": "http.response.body", "body": body[half:]})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query}
    asyncio.run(i18n.LanguageOverride(app)(scope, None, send))
    return sent


def test_language_override_puts_its_script_first_in_the_head():
    page = b"<!doctype html><html><head><meta charset='utf-8'><script type=module src=x.js></script></head></html>"
    sent = _run_override("/", b"lang=ar", b"text/html; charset=utf-8", page)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert body.startswith(b"<!doctype html><html><head>" + i18n.EARLY_SCRIPT.encode())
    assert body.index(b"navigator") < body.index(b"type=module")  # before Gradio's module script
    headers = dict(sent[0]["headers"])
    assert headers[b"content-length"] == str(len(body)).encode()
    # Other responses, and pages asked for without lang=, pass through untouched (streamed as they came).
    for args in (("/config", b"lang=ar", b"application/json", b'{"head": "<head>"}'),
                 ("/", b"", b"text/html", page), ("/", b"lang=ar", b"text/html", page, "POST")):
        sent = _run_override(*args)
        assert len(sent) == 3 and b"".join(m.get("body", b"") for m in sent[1:]) == args[3], args[:3]


def test_one_table_no_key_twice_and_the_same_fields_in_both_languages():
    from neuron_backend import texts as backend_texts
    from neuron_backend.messages import fields
    from tools.cache import messages as cache_messages
    from tools.qa import messages as qa_messages
    from tools.qa import words as qa_words
    from ui import texts as page_texts

    seen: dict[str, str] = {}
    for origin, parts in (("ui/texts", page_texts.PARTS), ("neuron_backend/texts", backend_texts.PARTS),
                          ("tools/qa", {"words": qa_words.WORDS, "messages": qa_messages.MESSAGES}),
                          ("tools/cache", {"messages": cache_messages.MESSAGES})):
        for part, table in parts.items():
            for key in table:
                assert key not in seen, f"{key} in {origin}/{part}.py and {seen[key]}"
                seen[key] = f"{origin}/{part}.py"
    assert set(seen) == set(i18n.TABLE)
    for key, (english, arabic) in i18n.TABLE.items():
        assert fields(english) == fields(arabic), (key, fields(english), fields(arabic))
    assert set(i18n.I18N.translations_dict["ar"]) >= set(i18n.TABLE)


def test_lang_of_a_request_cookie_then_address_then_browser():
    lang_of = i18n.lang_of
    assert lang_of(None) == "en" and lang_of({}) == "en"  # API clients send none of these
    assert lang_of({"accept-language": "ar-EG,ar;q=0.9,en;q=0.8"}) == "ar"
    assert lang_of({"accept-language": "fr-FR,ar;q=0.9"}) == "en"  # the page shows English to a French browser
    assert lang_of({"accept-language": "ar", "referer": "http://127.0.0.1:7860/?lang=en"}) == "en"
    # the cookie is what the page shows now (the footer's menu may have switched it): it wins
    assert lang_of({"cookie": "a=1; showcase_lang=ar", "referer": "http://h/?lang=en"}) == "ar"
    assert lang_of({"cookie": "showcase_lang=xx", "accept-language": "ar"}) == "ar"  # not ours: ignored


def test_say_fills_fields_in_the_language_of_the_event():
    import gradio as gr
    from gradio.context import LocalContext

    from neuron_backend.messages import msg

    key = next(k for k, (en, _) in i18n.TABLE.items() if "{" not in en)
    assert i18n.say(key) == i18n.TABLE[key][0]  # outside any event: English
    with i18n.speaking("ar"):
        assert i18n.say(key) == i18n.TABLE[key][1]
    token = LocalContext.request.set(gr.Request(headers={"cookie": "showcase_lang=ar"}))
    try:  # what Gradio sets around each handler call
        assert i18n.say(key) == i18n.TABLE[key][1]
        stopped = msg("image_stopped_before_start")
        arabic = i18n.TABLE["image_stopped_before_start"][1]
        assert str(stopped).startswith("Stopped before it started") and i18n.localized(stopped) == arabic
        assert i18n.localized(ValueError(stopped)) == arabic
        assert i18n.localized("plain") == "plain"
    finally:
        LocalContext.request.reset(token)
    with pytest.raises(KeyError, match="no string 'nope'"):
        i18n.say("nope")


def test_messages_keep_key_and_parameters_through_pickle():
    import pickle

    from neuron_backend.messages import Message, msg

    with pytest.raises(KeyError, match="no message 'nope'"):
        msg("nope")
    copy = pickle.loads(pickle.dumps(msg("image_stopped_before_start")))
    assert isinstance(copy, Message) and copy.key == "image_stopped_before_start"
    assert str(copy) == str(msg("image_stopped_before_start"))
