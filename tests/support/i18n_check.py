"""What is left in English in text the page shows in Arabic: run-time text is built with
``ui.i18n.say`` / backend ``msg``, so under ``speaking("ar")`` no English phrase should remain.

``english_phrases(text)`` returns runs of two or more Latin words (three letters or more each) outside
HTML tags, code spans, URLs and ``--flags``: "to first token" is a phrase left in English; a model
name, a flag, a unit ("s", "GiB") or one technical word beside Arabic is not.
"""

from __future__ import annotations

import html
import re

_TAG = re.compile(r"<[^>]*>")
_CODE = re.compile(r"`[^`]*`")
_URL = re.compile(r"\b\w+://\S+")
_FLAG = re.compile(r"--[\w-]+(?:[= ][\w./:-]+)?")
_WORD = r"[A-Za-z][A-Za-z'’]{2,}"
_PHRASE = re.compile(rf"{_WORD}(?:[ \t]+{_WORD})+")


def visible_text(markup: str) -> str:
    """Markup as a reader sees it: tags removed, entities decoded."""
    return html.unescape(_TAG.sub(" ", markup))


def english_phrases(text: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """Runs of 2+ Latin words in ``text`` (tags, code, URLs, flags and ``allowed`` phrases removed)."""
    text = visible_text(text)
    for pattern in (_CODE, _URL, _FLAG):
        text = pattern.sub(" ", text)
    for phrase in allowed:
        text = text.replace(phrase, " ")
    return _PHRASE.findall(text)


def has_arabic(text: str) -> bool:
    return any("\u0600" <= ch <= "\u06ff" for ch in text)


def arabic_text(text: str, allowed: tuple[str, ...] = ()) -> str:
    """``text``, checked to be Arabic with no English phrase left but ``allowed`` (Latin names beside it)."""
    assert has_arabic(text), text
    assert english_phrases(text, allowed) == [], (english_phrases(text, allowed), text)
    return text


def refused_in_both_languages(call, template: str, allowed: tuple[str, ...] = ()) -> None:
    """``call()`` is refused with the message ``template``: English in ``str()`` (logs and API clients), Arabic
    with no English phrase left but ``allowed`` on an Arabic page."""
    import pytest

    from neuron_backend.errors import InvalidRequestError
    from neuron_backend.messages import Message
    from ui.i18n import localized, speaking

    with pytest.raises(InvalidRequestError) as raised:
        call()
    message = raised.value.args[0]
    assert isinstance(message, Message) and message.template == template
    assert str(raised.value) == message.text("en")
    with speaking("ar"):
        arabic_text(localized(raised.value), allowed)
    with speaking("en"):
        assert localized(raised.value) == str(raised.value)
