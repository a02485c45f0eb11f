"""The page's words in English and Arabic: Gradio's ``gr.I18n``, the visitor's language, the right-to-left glue.

Static text is ``t("Prompt")`` (a ``gr.I18n`` id with both languages; the frontend shows the visitor's
locale); text built at run time is ``say("{n} tokens", n=3)`` in the language ``lang()`` reads from the
event's request, and ``localized(exc)`` gives a backend message in it. ``HEAD``, ``EARLY_SCRIPT`` and
``with_early_head`` add ``?lang=ar|en`` and keep ``<html dir>`` in step; ``CSS`` sets Arabic text right to
left in either language. How the language is chosen and what stays English: docs/languages.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import html
import re
from collections.abc import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import gradio as gr
from gradio.context import LocalContext

from neuron_backend.messages import (
    CONTEXT,
    LANGUAGES,
    Message,
    bidi_isolated,
    in_arabic,
    in_language,
    ltr_isolated,
)

# Gradio's own strings that its Arabic table (templates/frontend/assets/ar-*.js) lacks; English is Gradio's.
GRADIO_STRINGS: dict[str, tuple[str, str]] = {
    "chat_interface.new_chat": ("New chat", "محادثة جديدة"),
    "chat_interface.message_placeholder": ("Type a message...", "اكتب رسالة..."),
    "chat_interface.additional_inputs": ("Additional inputs", "مدخلات إضافية"),
    "chat_interface.chatbot": ("Chatbot", "روبوت المحادثة"),
    "chat_interface.conversation": ("Conversation", "محادثة"),
}
# Gradio's own strings that none of its locales holds (its status tracker announces a finished event to
# screen readers by this key, so the raw key was read out): English and Arabic here.
GRADIO_MISSING: dict[str, tuple[str, str]] = {
    "common.complete": ("Complete", "اكتمل"),
}

I18N = gr.I18n(en={key: en for key, (en, _) in GRADIO_MISSING.items()},  # t() adds the page's words
               ar={key: ar for key, (_, ar) in (GRADIO_STRINGS | GRADIO_MISSING).items()})
COOKIE = "showcase_lang"
_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("showcase_lang", default=None)
_COOKIE_RE = re.compile(rf"(?:^|;)\s*{COOKIE}=([A-Za-z-]+)")


def text_id(english: str) -> str:
    """The id Gradio's frontend knows a text by: short, stable, free of the dots svelte-i18n reads as paths."""
    return "t" + hashlib.sha1(english.encode(), usedforsecurity=False).hexdigest()[:12]


def t(english: str, ctx: str | None = None) -> gr.i18n.I18nData:
    """The translatable text for a component's label, info, placeholder or value (English, as shown)."""
    key = text_id(english if ctx is None else f"{ctx}{CONTEXT}{english}")
    I18N.translations["en"][key] = english
    arabic = in_arabic(english, ctx)
    I18N.translations["ar"][key] = english if arabic == english else ltr_isolated(arabic)
    return I18N(key)


def _pick(tag: str | None) -> str | None:
    """"ar", "en" for a language tag that names one of ours ("ar-EG" -> "ar"), else None."""
    primary = (tag or "").strip().split("-")[0].split("_")[0].lower()
    return primary if primary in LANGUAGES else None


def lang_of(headers) -> str:
    """The language a request's page shows: the cookie, else the page's ?lang=, else Accept-Language, else "en"."""
    if headers is None:
        return "en"
    found = _COOKIE_RE.search(headers.get("cookie") or "")
    if found and _pick(found.group(1)):
        return _pick(found.group(1))
    wanted = parse_qs(urlsplit(headers.get("referer") or "").query).get("lang", [""])[0]
    if _pick(wanted):
        return _pick(wanted)
    first = (headers.get("accept-language") or "").split(",")[0].split(";")[0]
    return _pick(first) or "en"


def lang() -> str:
    """The language of the event being handled ("en" outside one, or for an API client that asks for none).

    Gradio sets ``LocalContext.request`` around every call and every step of a generator handler,
    so this works in any handler thread without passing the request down.
    """
    forced = _FORCED.get()
    if forced:
        return forced
    request = LocalContext.request.get(None)
    return lang_of(getattr(request, "headers", None)) if request is not None else "en"


@contextlib.contextmanager
def speaking(language: str) -> Iterator[None]:
    """Build text in ``language`` within the block (tests; code outside any event)."""
    token = _FORCED.set(language)
    try:
        yield
    finally:
        _FORCED.reset(token)


def say(template: str, ctx: str | None = None, **params) -> str:
    """``template`` (English, {fields}) in the current language, filled with ``params``.

    In Arabic, each value and each Latin run of the template sits in a bidi isolate (``bidi_isolated``).
    """
    language = lang()
    shown = in_arabic(template, ctx) if language == "ar" else template
    if shown == template:  # English, or text the catalog does not hold: as written
        return template.format(**{k: in_language(v, language) for k, v in params.items()}) if params else template
    if not params:
        return ltr_isolated(shown)
    return bidi_isolated(shown, {k: in_language(v, language) for k, v in params.items()},
                         {k for k, v in params.items() if isinstance(v, Message)})


def localized(value) -> str:
    """A backend Message, or an error whose message is one, in the current language; other text as it is."""
    return str(in_language(value, lang()))


def bilingual_html(text: str | Callable[[], str]) -> str:
    """Both languages of ``text`` for HTML built outside an event (no request, so no ``lang()``): CSS shows
    the one of ``<html lang>``. ``text``: English text, or a function that builds the text with ``say()``."""
    build = (lambda: say(text)) if isinstance(text, str) else text
    spans = []
    for language in LANGUAGES:
        with speaking(language):
            shown = html.escape(build(), quote=False)
        marked = ' lang="ar"' if language == "ar" else ""
        spans.append(f'<span class="i18n-{language}"{marked}>{shown}</span>')
    return "".join(spans)


# First in every page's <head> (with_early_head; launch(head=) comes after the locale is chosen): ?lang=ar|en
# redefines navigator.language before svelte-i18n reads it, and <html lang>/<html dir> are written for the
# locale it will choose, before the first paint.
EARLY_SCRIPT = """<script>
(() => {
  const asked = (new URLSearchParams(location.search).get("lang") || "").toLowerCase();
  const wanted = ["ar", "en"].includes(asked) ? asked : null;
  if (wanted) {
    document.cookie = `showcase_lang=${wanted}; path=/; SameSite=Lax`;
    for (const [name, value] of [["language", wanted], ["languages", [wanted]]]) {
      try { Object.defineProperty(navigator, name, {get: () => value, configurable: true}); } catch (e) {}
    }
  }
  const shown = wanted || ((navigator.language || "").toLowerCase().startsWith("ar") ? "ar" : "en");
  document.documentElement.setAttribute("lang", shown);
  document.documentElement.setAttribute("dir", shown === "ar" ? "rtl" : "ltr");
})();
</script>"""

# The rule that shows one language of bilingual_html() travels with EARLY_SCRIPT at the top of <head>, not in
# Blocks(css=), which Gradio mounts only once its config has arrived: it holds from the first byte of the page.
EARLY_HEAD = ('<style>html:not([lang^="ar"]) .i18n-ar, html[lang^="ar"] .i18n-en { display: none; }</style>'
              + EARLY_SCRIPT)

# <html dir> follows <html lang>, which svelte-i18n writes for the chosen locale (at start, and when
# the footer's Settings menu changes the language): rtl for Arabic, ltr otherwise.
HEAD = """<script>
(() => {
  const root = document.documentElement;
  const follow = () => {
    const arabic = (root.getAttribute("lang") || "").toLowerCase().startsWith("ar");
    root.setAttribute("dir", arabic ? "rtl" : "ltr");
    // the server builds run-time text (status bar, stats, toasts) in this language (ui/i18n.py lang())
    document.cookie = `showcase_lang=${arabic ? "ar" : "en"}; path=/; SameSite=Lax`;
  };
  new MutationObserver(follow).observe(root, {attributes: true, attributeFilter: ["lang"]});
  follow();
})();
</script>"""


async def with_early_head(app, scope, receive, send) -> None:
    """Serve a request of the page through ``app`` with ``EARLY_HEAD`` first in the <head> of its answer.

    Only an HTML answer is touched (its body is buffered, then Content-Length is set anew); any other passes
    through as it came. The core's edge (ui/guards.py) sends only the page's GETs here.
    """
    start: dict | None = None
    chunks: list[bytes] = []

    async def rewrite(message):
        nonlocal start
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if content_type.startswith(b"text/html"):
                start = message
                return
        elif message["type"] == "http.response.body" and start is not None:
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks).replace(b"<head>", b"<head>" + EARLY_HEAD.encode(), 1)
            headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    await app(scope, receive, rewrite)


# Arabic text reads right to left in either UI language: each paragraph of a message, a textbox or a
# grid cell takes its direction from its first strong letter (unicode-bidi: plaintext) and starts on
# that side (text-align: start). In Arabic the whole page is dir="rtl" (HEAD), so rows and labels flip.
CSS = """
#chatbot .message-content, #chatbot .message .prose, #chatbot .message p, #chatbot .message li,
textarea, input[type="text"], input:not([type]), [role="gridcell"], td, .cell-wrap, .cell-wrap .text,
.example-text-content, .prose p {
  unicode-bidi: plaintext;
  text-align: start;
}
#page-header h1, #page-header .summary, #page-header .demo-notice { unicode-bidi: plaintext; text-align: start; }
/* Gradio writes dir="ltr" on every block (its per-component rtl= flag, off here): in Arabic they follow the page */
html[dir="rtl"] .block[dir="ltr"] { direction: rtl; }
html[dir="rtl"] label > input[type="radio"], html[dir="rtl"] label > input[type="checkbox"] {
  margin-right: 0; margin-left: var(--size-2, 8px);
}
/* a file's name reads left to right in one piece ("20261201-...-s7.png", not "png.20261201-..."), and a flag in the
   header never breaks after its hyphens ("- -" at a line's end, "models full" on the next) */
html[dir="rtl"] .file-preview td.filename { direction: ltr; unicode-bidi: isolate; }
/* code in a paragraph is Latin and reads left to right in one piece (".jsonl", not "jsonl.") */
html[dir="rtl"] .prose code { direction: ltr; unicode-bidi: isolate; }
#page-header code { white-space: nowrap; }
/* a slider is drawn from its minimum: at the right in a right-to-left block, where Chromium puts the thumb's start
   (Gradio paints the filled part with a gradient "to right" on the track) */
html[dir="rtl"] input[type="range"]::-webkit-slider-runnable-track {
  background: linear-gradient(to left, var(--slider-color) var(--range_progress),
                              var(--neutral-200) var(--range_progress));
}
/* code, JSON and the like stay left to right in either language */
html[dir="rtl"] .cm-editor, html[dir="rtl"] pre, html[dir="rtl"] .json-holder { direction: ltr; text-align: left; }
"""

# Gradio 6.31's frontend titles a toast with its type ("Warning", "Error", ...) in English whatever the locale
# (and ignores gr.Warning(title=)): in Arabic the CSS hides that word and writes the table's one before it.
TOAST_TYPES = {"error": "Error", "warning": "Warning", "info": "Info", "success": "Success"}  # Gradio's words


def _toast_title_css() -> str:
    rules = ['html[lang^="ar"] .toast-title { font-size: 0; }',
             'html[lang^="ar"] .toast-title > * { font-size: var(--text-md); }']
    for kind, english in TOAST_TYPES.items():
        arabic = in_arabic(english).replace("\\", "").replace('"', "")
        rules.append(f'html[lang^="ar"] .toast-title.{kind}::before '
                     f'{{ content: "{arabic}"; font-size: var(--text-lg); }}')
    return "\n".join(rules) + "\n"


CSS += _toast_title_css()
