"""What the backend says to people, in English and Arabic: one table, looked up by key.

A message the page may show is built as ``msg("key", **params)``: a ``str`` whose text is the
English one (what logs, API clients and the CLI read, unchanged), carrying its key and parameters
so the UI can show it in the visitor's language (``ui/i18n.py`` merges this table into its own
``gr.I18n`` table and calls ``Message.text(lang)``). Parameters are user input, numbers, flags and
allowed values; they are inserted as they are in either language (a parameter that is itself a
``Message`` is translated too).

No Gradio here: the backend stays importable without it.
"""

from __future__ import annotations

import string

from .texts import PARTS

LANGUAGES = ("en", "ar")

# key -> (English, Arabic), from neuron_backend/texts/ (one module per wing).
MESSAGES: dict[str, tuple[str, str]] = {k: v for part in PARTS.values() for k, v in part.items()}


class Message(str):
    """English text (``str(m)``) that knows its key and parameters, so it can be shown in another language."""

    key: str
    params: dict

    def __new__(cls, key: str, **params):
        if key not in MESSAGES:
            raise KeyError(f"no message {key!r} in neuron_backend/texts/ MESSAGES")
        self = super().__new__(cls, _fill(MESSAGES[key][0], params, "en"))
        self.key, self.params = key, params
        return self

    def text(self, lang: str) -> str:
        """The message in ``lang`` ("en" or "ar"; anything else reads English)."""
        index = LANGUAGES.index(lang) if lang in LANGUAGES else 0
        return _fill(MESSAGES[self.key][index], self.params, lang)

    def __reduce__(self):  # pickles (multiprocessing, Gradio's state copies) keep key and parameters
        return (_rebuild, (self.key, self.params))


def _rebuild(key: str, params: dict) -> Message:
    return Message(key, **params)


def _fill(template: str, params: dict, lang: str) -> str:
    return template.format(**{k: in_language(v, lang) for k, v in params.items()})


def register(table: dict[str, tuple[str, str]]) -> None:
    """Add messages of a part outside the core (the annex registers its own on import); a key may not change."""
    for key, texts in table.items():
        if MESSAGES.setdefault(key, texts) != texts:
            raise KeyError(f"message {key!r} is registered twice with different texts")


def msg(key: str, **params) -> Message:
    """The message ``key`` with its parameters (English as a str; ``.text(lang)`` for another language)."""
    return Message(key, **params)


def in_language(value, lang: str):
    """``value`` in ``lang`` when it is a Message (or an error whose message is one); else ``value`` as it is."""
    if isinstance(value, Message):
        return value.text(lang)
    if isinstance(value, BaseException) and len(value.args) == 1 and isinstance(value.args[0], Message):
        return value.args[0].text(lang)
    return value


def fields(template: str) -> set[str]:
    """The {names} a template fills (tests check both languages use the same ones)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}
