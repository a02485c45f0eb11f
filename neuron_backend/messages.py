"""What the backend says to people: English written where it is raised, Arabic from one catalog.

A message the page may show is built as ``tr("Model folder {path} has no config.json …", path=p)``: a
``str`` whose text is the English one (what logs, API clients and the CLI read), carrying its template
and parameters so the UI can show it in the visitor's language (``Message.text(lang)``). The Arabic
lives in ``neuron_backend/arabic.json`` (data: one ``"English": "Arabic"`` pair a line), keyed by the
English template (gettext's convention); a part outside the core (the annex) registers its own file with
``register(read_catalog(path))``. Parameters are user input, numbers, flags and allowed values; they
are inserted as they are in either language (a parameter that is itself a ``Message`` is translated too).
Where one English word reads two ways in Arabic (a task "failed" and a QA cell "failed"), the call names a context
(``tr("failed", ctx="qa")``) and the catalog holds ``"qa\u0004failed"``, gettext's msgctxt.
``tests/test_catalog.py`` checks that every template written in the code has an Arabic entry with the
same ``{fields}``.

No Gradio here: the backend stays importable without it.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

LANGUAGES = ("en", "ar")


def read_catalog(path: Path) -> dict[str, str]:
    """A catalog file: a JSON object, English template -> Arabic (bidi marks written as \\u escapes)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


# English template -> Arabic, the core's and every registered part's
CATALOG: dict[str, str] = read_catalog(Path(__file__).with_name("arabic.json"))


def register(catalog: dict[str, str]) -> None:
    """Add a part's Arabic (the annex registers its file on import); a template's Arabic may not change."""
    for template, arabic in catalog.items():
        if CATALOG.setdefault(template, arabic) != arabic:
            raise KeyError(f"{template!r} is registered twice with different Arabic")


CONTEXT = "\x04"  # between a context and its template in a catalog key (gettext's msgctxt separator)


def in_arabic(template: str, ctx: str | None = None) -> str:
    """The Arabic of an English template, in ``ctx`` if the catalog has it there (else the English itself)."""
    if ctx is not None and (found := CATALOG.get(f"{ctx}{CONTEXT}{template}")) is not None:
        return found
    return CATALOG.get(template, template)


class Message(str):
    """English text (``str(m)``) that knows its template and parameters, so it can be shown in Arabic too."""

    template: str
    params: dict
    ctx: str | None

    def __new__(cls, template: str, ctx: str | None = None, **params):
        self = super().__new__(cls, _fill(template, params, "en"))
        self.template, self.params, self.ctx = template, params, ctx
        return self

    def text(self, lang: str) -> str:
        """The message in ``lang`` ("en" or "ar"; anything else reads English)."""
        return _fill(in_arabic(self.template, self.ctx) if lang == "ar" else self.template, self.params, lang)

    def __reduce__(self):  # pickles (multiprocessing, Gradio's state copies) keep template and parameters
        return (_rebuild, (self.template, self.params, self.ctx))


def _rebuild(template: str, params: dict, ctx: str | None = None) -> Message:
    return Message(template, ctx, **params)


def _fill(template: str, params: dict, lang: str) -> str:
    return template.format(**{k: in_language(v, lang) for k, v in params.items()})


def tr(template: str, ctx: str | None = None, **params) -> Message:
    """The message ``template`` (English, ``{name}`` fields) filled with ``params``; ``.text(lang)`` for Arabic."""
    return Message(template, ctx, **params)


def in_language(value, lang: str):
    """``value`` in ``lang`` when it is a Message (or an error whose message is one); else ``value`` as it is."""
    if isinstance(value, Message):
        return value.text(lang)
    if isinstance(value, BaseException) and len(value.args) == 1 and isinstance(value.args[0], Message):
        return value.args[0].text(lang)
    return value


def fields(template: str) -> set[str]:
    """The {names} a template fills (the catalog test checks both languages use the same ones)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def shown_value(value: object) -> str:
    """A refused value as a message may echo it: a short repr, or the digit count of a huge integer.

    ``str()`` of an integer over 4300 digits raises ValueError (Python's int_max_str_digits), and a
    long text would bury the message: both are shortened here, never echoed whole.
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**40:
        return tr("a whole number of about {digits} digits", digits=int(value.bit_length() * 0.30103) + 1)
    if isinstance(value, str) and len(value) > 40:
        return repr(value[:37]) + "..."
    try:
        text = repr(value)
    except ValueError:
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def said(exc: BaseException) -> str:
    """An error's message: the Message it carries (translatable), else its text."""
    return exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], Message) else str(exc)


def joined(parts, key: str = "{a}, {b}") -> str:
    """``parts`` joined by the separator message ``key`` (", " or "; "), each part kept translatable."""
    parts = list(parts)
    text = parts[0] if parts else ""
    for part in parts[1:]:
        text = tr(key, a=text, b=part)
    return text
