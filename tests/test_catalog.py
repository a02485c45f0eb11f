"""English where it is written, Arabic from one catalog: every template the code writes has an Arabic
entry with the same {fields}, no component is given a literal label, and the ?lang= override reaches
the page's <head> first."""

from __future__ import annotations

import ast
import asyncio
import subprocess
from pathlib import Path

import pytest

import tools.cache.panel  # noqa: F401 - registers the bundles' Arabic
import tools.chat_batch  # noqa: F401 - registers the chat batch's Arabic
import tools.conversation_files  # noqa: F401 - registers the conversation files' Arabic
import tools.paste_back  # noqa: F401 - registers paste-back's Arabic
import tools.qa.tab  # noqa: F401 - registers the QA bench's Arabic
import tools.remote  # noqa: F401 - registers the remote engines' Arabic
from neuron_backend.messages import CATALOG, fields, register
from ui import i18n
from ui.chat_tab import EXAMPLE_PROMPTS
from ui.image_tab import IMAGE_EXAMPLES

ROOT = Path(__file__).resolve().parents[1]
UI = ROOT / "ui"
# Parameters that the page shows as static text; a str literal there bypasses the catalog.
SHOWN = {"label", "info", "placeholder", "examples_label"}
# Components whose first positional argument is shown text (a button's value, a tab's or accordion's title).
TITLED = {"Button", "UploadButton", "Accordion", "Tab", "Markdown"}
# The files that build what the page shows (api.py's hidden components are named for API clients).
PAGE_FILES = ["__init__.py", "status_panel.py", "chat_tab.py",
              "image_tab.py", "../tools/qa/tab.py", "../tools/qa/views.py",
              "../tools/cache/panel.py", "../tools/paste_back/drop_box.py", "../tools/conversation_files/row.py"]
# The calls whose first argument is an English template shown in the visitor's language.
TRANSLATED = {"tr", "say", "t", "bilingual_html", "Message"}
# Words translated from a variable (say(state), t(kind)): each must be in the catalog too.
VARIABLE_WORDS = {
    "task states and engine chips (ui/status_panel.py)": ["queued", "running", "ready", "failed",
                                                                        "skipped", "warming up", "loading",
                                                                        "disabled", "Chat", "Image"],
    "task table columns (ui/status_panel.py TASK_COLUMNS)": ["task", "shape", "state", "seconds", "compile cache",
                                                             "error"],
    "toast titles (ui/i18n.py TOAST_TYPES)": ["Error", "Warning", "Info", "Success"],
    "PNG sources (tools/paste_back/drop_box.py PNG_SOURCES)": ["this app's parameters",
                                                               "its A1111-style parameters text"],
    "example prompts (ui/chat_tab.py EXAMPLE_PROMPTS, ui/image_tab.py IMAGE_EXAMPLES)": [*EXAMPLE_PROMPTS,
                                                                                        *IMAGE_EXAMPLES],
    "QA kinds, marks, statuses and A/B picks (tools/qa)": ["chat", "image", "both", "pass", "fail", "unmarked",
                                                          "pending", "done", "stopped", "left", "right", "tie"],
}
LATIN_ONLY = {"top_p", "top_k", "Qwen3"}  # parameter and model names stay Latin


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            yield node


def source_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in listed if f.split("/")[0] in ("neuron_backend", "ui", "tools", "app.py")
            and (ROOT / f).exists()]


def written_templates() -> dict[str, list[str]]:
    """Every English template the code passes to tr(), say(), t(), bilingual_html() or Message(), and where."""
    found: dict[str, list[str]] = {}
    for path in source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)  # a CLI's own say= prints
               for a in [*n.args.args, *n.args.kwonlyargs]} | {n.name for n in ast.walk(tree)
                                                                if isinstance(n, ast.FunctionDef)}
        for call in _calls(path):
            name = call.func.id if isinstance(call.func, ast.Name) else None
            if name not in TRANSLATED - own or not call.args:
                continue
            for arg in ([call.args[0].body, call.args[0].orelse] if isinstance(call.args[0], ast.IfExp)
                        else [call.args[0]]):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.setdefault(arg.value, []).append(f"{path.relative_to(ROOT)}:{call.lineno}")
                else:  # a template the code builds must not be a key looked up somewhere
                    assert not isinstance(arg, ast.JoinedStr), f"{path.relative_to(ROOT)}:{call.lineno}: an f-string"
    return found


def test_every_template_written_in_the_code_has_arabic_with_the_same_fields():
    written = written_templates()
    assert len(written) >= 500, len(written)  # the walk finds the calls (a broken walk finds none)
    missing = {t: where for t, where in written.items() if t not in CATALOG}
    assert not missing, f"templates without Arabic (neuron_backend/arabic.json or the annex's arabic.json): {missing}"
    for template in written:
        assert fields(template) == fields(CATALOG[template]), (template, CATALOG[template])
    for origin, words in VARIABLE_WORDS.items():
        assert not [w for w in words if w not in CATALOG], origin


def test_arabic_texts_are_arabic_where_the_english_has_words():
    for english, arabic in CATALOG.items():
        assert arabic.strip(), english
        if english in LATIN_ONLY:
            assert arabic == english, english
        elif any(ch.isalpha() for ch in english.replace("{", " ").split("}")[-1] + english.split("{")[0]):
            assert any("\u0600" <= ch <= "\u06ff" for ch in arabic), (english, arabic)


def test_a_template_keeps_one_arabic_and_gradios_own_keys_stay_gradios():
    register({"ready": CATALOG["ready"]})  # the same Arabic again: fine
    with pytest.raises(KeyError, match="registered twice"):
        register({"ready": "something else"})
    assert i18n.I18N.translations_dict["ar"]["chat_interface.new_chat"] == "محادثة جديدة"  # Gradio's own key
    assert "chat_interface.new_chat" not in i18n.I18N.translations_dict["en"]  # English keeps Gradio's
    shown = i18n.t("Prompt")  # what a component gets: an id whose English and Arabic the frontend knows
    key = i18n.text_id("Prompt")
    assert shown.key == key and "." not in key
    assert i18n.I18N.translations_dict["en"][key] == "Prompt"
    assert i18n.I18N.translations_dict["ar"][key] == CATALOG["Prompt"]


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
    assert not literal, "shown text not through t() (ui/i18n.py): " + "; ".join(literal)


def test_bilingual_html_escapes_and_marks_both_languages():
    text = i18n.bilingual_html("Hugging Face models on AWS Trainium")
    assert '<span class="i18n-en">Hugging Face models on AWS Trainium</span>' in text
    assert '<span class="i18n-ar" lang="ar">نماذج Hugging Face على AWS Trainium</span>' in text
    summary = i18n.bilingual_html(lambda: i18n.say("Chat with {chat}, run natively on Trainium through PyTorch's "
                                                   "neuron device: every shape is compiled once at start, so after "
                                                   "warm-up no request waits for a compile.", chat="Qwen3-0.6B"))
    assert "PyTorch's" in summary and "حاور \u2066Qwen3-0.6B\u2069،" in summary  # text, not an attribute: quotes stay


def _run_override(path: str, query: bytes, content_type: bytes, body: bytes) -> list[dict]:
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
        half = len(body) // 2
        await send({"type": "http.response.body", "body": body[:half], "more_body": True})
        await send({"type": "http.response.body", "body": body[half:]})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query}
    asyncio.run(i18n.with_early_head(app, scope, None, send))
    return sent


def test_language_override_puts_its_script_first_in_the_head():
    page = b"<!doctype html><html><head><meta charset='utf-8'><script type=module src=x.js></script></head></html>"
    sent = _run_override("/", b"lang=ar", b"text/html; charset=utf-8", page)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert body.startswith(b"<!doctype html><html><head>" + i18n.EARLY_HEAD.encode())
    assert body.index(b"navigator") < body.index(b"type=module")  # before Gradio's module script
    headers = dict(sent[0]["headers"])
    assert headers[b"content-length"] == str(len(body)).encode()
    # A page asked for without lang= gets it too: it writes <html lang> and dir for an ar-* browser's Arabic.
    sent = _run_override("/", b"", b"text/html", page)
    assert b"".join(m.get("body", b"") for m in sent[1:]).startswith(
        b"<!doctype html><html><head>" + i18n.EARLY_HEAD.encode())
    # Other responses pass through untouched (streamed as they came); which requests come here at all: the
    # core's edge (tests/ui/test_guards.py).
    for args in (("/config", b"lang=ar", b"application/json", b'{"head": "<head>"}'),
                 ("/", b"lang=ar", b"text/plain", b"<head>")):
        sent = _run_override(*args)
        assert len(sent) == 3 and b"".join(m.get("body", b"") for m in sent[1:]) == args[3], args[:3]


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

    from neuron_backend.messages import tr

    template = "Stopped before it started: no step ran and nothing was saved."
    assert i18n.say(template) == template  # outside any event: English
    with i18n.speaking("ar"):
        assert i18n.say(template) == CATALOG[template]
    token = LocalContext.request.set(gr.Request(headers={"cookie": "showcase_lang=ar"}))
    try:  # what Gradio sets around each handler call
        assert i18n.say(template) == CATALOG[template]
        stopped = tr(template)
        arabic = CATALOG[template]
        assert str(stopped).startswith("Stopped before it started") and i18n.localized(stopped) == arabic
        assert i18n.localized(ValueError(stopped)) == arabic
        assert i18n.localized("plain") == "plain"
    finally:
        LocalContext.request.reset(token)
    with i18n.speaking("ar"):  # text the catalog does not hold reads as written (the catalog test finds it)
        assert i18n.say("nope {n}", n=1) == "nope 1"


def test_messages_keep_template_and_parameters_through_pickle():
    import pickle

    from neuron_backend.messages import Message, tr

    copy = pickle.loads(pickle.dumps(tr("{n} s", n=3)))
    assert isinstance(copy, Message) and copy.template == "{n} s" and copy.params == {"n": 3}
    assert copy.text("ar") == CATALOG["{n} s"].format(n=3)
    copy = pickle.loads(pickle.dumps(tr("Stopped before it started: no step ran and nothing was saved.")))
    assert copy.template == "Stopped before it started: no step ran and nothing was saved."
    assert str(copy) == str(tr("Stopped before it started: no step ran and nothing was saved."))


def test_arabic_keeps_flags_quoted_values_and_units_in_bidi_isolates():
    from neuron_backend.messages import LRI, PDI, tr

    auto = tr("--models auto: {why}; using the offline demo models with random weights", why="no model folder")
    assert str(auto) == "--models auto: no model folder; using the offline demo models with random weights"
    assert auto.text("ar").startswith(f"{LRI}--models auto{PDI}: no model folder؛ ")  # the flag in one piece
    need = tr("needs ~{total} GiB in {dtype} ({params} B parameters: weights {weights} GiB + decoding {size} {decode} "
              "GiB + activations and overhead {rest} GiB)", total="1.0", dtype="bfloat16", params="4.0",
              weights="2.5", size="1024x1024", decode="0.5", rest="0.3")
    assert str(need).startswith("needs ~1.0 GiB in bfloat16 (4.0 B parameters")
    arabic = need.text("ar")
    assert f"{LRI}~1.0 GiB{PDI}" in arabic and f"{LRI}2.5 GiB{PDI} +" in arabic and f"{LRI}bfloat16" not in arabic
    quoted = tr("{name} must be a whole number from {low} to {high}, not {value}.", name="steps", low=1, high=50,
                value='key="a, b"')
    assert str(quoted) == 'steps must be a whole number from 1 to 50, not key="a, b".'
    assert f'{LRI}key="a, b"{PDI}' in quoted.text("ar")
    mixed = tr("{name} must be a whole number from {low} to {high}, not {value}.", name="steps", low=1, high=50,
               value="'x مرحبا'")
    assert "'x مرحبا'" in mixed.text("ar") and f"{LRI}'x" not in mixed.text("ar")  # Arabic in it: read in line
    with i18n.speaking("ar"):  # the page's own texts: say() and the labels t() hands to the frontend
        assert i18n.say("--models auto: {why}; using the offline demo models with random weights",
                        why="--x") == auto.text("ar").replace("no model folder", f"{LRI}--x{PDI}")
        label = i18n.t("Exporting the compile cache is an operator action: start the app with --auth and log in.")
        assert f"{LRI}--auth{PDI}" in i18n.I18N.translations["ar"][label.key]
    with i18n.speaking("en"):
        assert i18n.say("--models auto: {why}; using the offline demo models with random weights",
                        why="--x") == "--models auto: --x; using the offline demo models with random weights"
