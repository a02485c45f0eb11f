"""What the backend says to people: English written where it is raised, Arabic from one catalog.

``tr("Model folder {path} has no config.json …", path=p)`` is a ``str`` whose text is the English one,
carrying its template and parameters for ``Message.text(lang)``; the Arabic comes from
``neuron_backend/arabic.json`` (plug-ins ``register`` their own). How and why: docs/languages.md.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

LANGUAGES = ("en", "ar")


def read_catalog(path: Path) -> dict[str, str]:
    """A catalog file: a JSON object, English template -> Arabic (bidi marks written as \\u escapes)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


# English template -> Arabic, the core's and every registered part's
CATALOG: dict[str, str] = read_catalog(Path(__file__).with_name("arabic.json"))


def register(catalog: dict[str, str]) -> None:
    """Add a part's Arabic (a plug-in registers its file on import); a template's Arabic may not change."""
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
        return _fill(self.template, self.params, lang, in_arabic(self.template, self.ctx) if lang == "ar" else None)

    def __reduce__(self):  # pickles (multiprocessing, Gradio's state copies) keep template and parameters
        return (_rebuild, (self.template, self.params, self.ctx))


def _rebuild(template: str, params: dict, ctx: str | None = None) -> Message:
    return Message(template, ctx, **params)


def _fill(template: str, params: dict, lang: str, arabic: str | None = None) -> str:
    """``template`` filled in ``lang``; ``arabic``: its Arabic, isolated (text the catalog lacks reads as written)."""
    values = {k: in_language(v, lang) for k, v in params.items()}
    if arabic is None or arabic == template:
        return template.format(**values)
    return bidi_isolated(arabic, values, {k for k, v in params.items() if isinstance(v, Message)})


# Unicode's directional isolates: a run between LRI (or FSI, which takes the direction of its first strong
# letter) and PDI is ordered on its own and sits in the sentence as one neutral character. FSI is not written
# here, but text that already holds one is left as it is.
LRI, FSI, PDI = "\u2066", "\u2068", "\u2069"
# Left-to-right runs inside Arabic text: flags, paths, commands, model ids, a value with its unit ("--models tiny",
# "/data/compile-cache", "Qwen3-0.6B", "~{size} GiB"). Drawn in a right-to-left paragraph, their leading or trailing
# "-", "/", "~", "." and spaces resolve to the paragraph's direction and the run reads jumbled ("(tiny --models)",
# "1.0~ GiB"); an isolate keeps each run in one piece. Private-use characters stand for a template's fields:
# U+E000... for a left-to-right value (part of a run), U+F000... for a right-to-left one (never part of one).
_FIELD_MARK, _RTL_FIELD_MARK = 0xE000, 0xF000
_PIECE = r"(?:[A-Za-z0-9_./:~@=+#%`\\'\uE000-\uEFFF-]|\(\)|&(?:lt|gt|amp|quot|#\d+);|<[\w-]+>)+"
# pieces joined by single spaces, not after a "." ":" or "," that ends a clause, nor to a bare "+" or "-" between words
_RUN = re.compile(rf"{_PIECE}(?:(?<![.,:]) (?=[^ ]*[A-Za-z0-9\uE000-\uEFFF]){_PIECE})*")
_HTML_TAG = re.compile(r"(<[^>]*>)")
# HTML's inline tags in a plain-text template ("<b>", "</code>") are no run's piece; "<folder>" is text
_INLINE_TAG = re.compile(r"(</?(?:a|b|bdi|br|code|details|div|em|i|kbd|li|ol|p|pre|small|span|strong|sub|summary|sup"
                         r"|ul)\b[^>]*>)")
_NUMBER = re.compile(r"[0-9]+(?:[.,][0-9]+)*")


def _isolate(match: re.Match, markup: bool) -> str:
    run = match.group(0)
    core = run.rstrip(".,:;")
    if core.endswith("'") and core.count("'") % 2:  # a closing quote whose opening one is outside the run
        core = core[:-1].rstrip(".,:;")
    tail = run[len(core):]
    fields = sum(_FIELD_MARK <= ord(ch) < _RTL_FIELD_MARK for ch in core)
    if fields:
        keep = len(core) == 1  # a lone field: its value is isolated on its own
    elif not re.search(r"[A-Za-z]", core):  # numbers ("3/7", "~12" before an Arabic unit) read with the sentence
        keep = True
    else:
        keep = bool(re.fullmatch(r"[A-Za-z0-9 ]+", core))  # plain words ("cpu", "Hugging Face", "64x64")
    if keep:
        return run
    return (f'<bdi dir="ltr">{core}</bdi>' if markup else f"{LRI}{core}{PDI}") + tail


def _outside_isolates(text: str, change) -> str:
    """``text`` with ``change`` applied to each stretch outside the isolates it already holds."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in (LRI, FSI, "\u2067"):
            if depth == 0:
                out.append(change(text[start:i]))
                start = i
            depth += 1
        elif ch == PDI and depth:
            depth -= 1
            if depth == 0:
                out.append(text[start:i + 1])
                start = i + 1
    out.append(change(text[start:]) if depth == 0 else text[start:])
    return "".join(out)


def ltr_isolated(text: str, markup: bool = False) -> str:
    """``text`` with its Latin technical runs in left-to-right isolates (for text shown right to left): in
    ``<bdi dir="ltr">`` when ``markup`` (HTML; tags and entities left whole), else between LRI and PDI (HTML's
    inline tags left whole). Runs already inside an isolate are left as they are."""
    if not text:
        return text
    parts = (_HTML_TAG if markup else _INLINE_TAG).split(text)
    return "".join(part if i % 2 else _outside_isolates(part, lambda stretch: _RUN.sub(
        lambda m: _isolate(m, markup), stretch)) for i, part in enumerate(parts))


_RTL_LETTER = re.compile(r"[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc]")  # Hebrew and Arabic letters


def _right_to_left(text: str) -> bool:
    """Whether ``text`` holds Arabic (or Hebrew) letters: it reads in the sentence's own direction."""
    return bool(_RTL_LETTER.search(text))


def _value_isolated(text: str, in_ltr_run: bool) -> str:
    """A filled-in value as it sits in Arabic text: a left-to-right one in LRI..PDI; bare when it holds Arabic,
    no letter or digit, only plain words or a number, or sits inside a left-to-right run (``in_ltr_run``)."""
    if _right_to_left(text) or not re.search(r"[A-Za-z0-9]", text):
        return text
    if in_ltr_run or re.fullmatch(r"[A-Za-z0-9 ]+", text):
        return text
    return f"{LRI}{text}{PDI}"


def bidi_isolated(template: str, values: dict, translated: set[str] = frozenset()) -> str:
    """An Arabic ``template`` filled with ``values``, each left-to-right run in an isolate (docs/languages.md).

    ``translated``: names whose value is a Message already in Arabic (ordered by its own isolates).
    """
    marked, shown = [], {}
    for literal, name, spec, conversion in string.Formatter().parse(template):
        marked.append(literal)
        if name is None:
            continue
        field = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        text = field.format(**values)
        if _NUMBER.fullmatch(text):  # a number joins the runs around it ("{used} GiB" -> "3.0 GiB")
            marked.append(text)
            continue
        right_to_left = name in translated or _right_to_left(text)
        mark = chr((_RTL_FIELD_MARK if right_to_left else _FIELD_MARK) + len(shown))
        shown[mark] = (text, name in translated)
        marked.append(mark)
    out, depth = [], 0
    for ch in ltr_isolated("".join(marked)):
        if ch in (LRI, FSI):
            depth += 1
        elif ch == PDI:
            depth -= 1
        if ch in shown:  # never inside an isolate when right to left (its mark is no run's piece)
            text, translated_already = shown[ch]
            ch = text if translated_already else _value_isolated(text, depth > 0)
        out.append(ch)
    return "".join(out)


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
