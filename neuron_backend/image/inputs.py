"""Checks of the values an image request carries; each refusal says what is allowed."""

from __future__ import annotations

import re
import unicodedata

from ..errors import InvalidRequestError, real_number
from ..messages import tr

GUIDANCE_MIN, GUIDANCE_MAX = 1.0, 20.0  # 1.0 means no classifier-free guidance
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # half of a UTF-16 pair: no UTF-8 encoder (tokenizer, PNG, JSON) takes it


def clean_prompt(prompt: object, max_chars: int) -> str:
    """The prompt without control characters (newline and tab kept), stripped; refuse empty, long or not Unicode."""
    if not isinstance(prompt, str):
        raise InvalidRequestError(tr("The prompt must be text, not {kind}.", kind=type(prompt).__name__))
    bad = _SURROGATE.search(prompt)
    if bad:
        raise InvalidRequestError(tr("{what} holds a lone surrogate ({char}) at character {at}, which is not valid "
                                     "Unicode; send UTF-8 text.", what=tr("The prompt"), char=ascii(bad.group()),
                                     at=bad.start()))
    text = prompt.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc").strip()
    if not text:
        raise InvalidRequestError(tr("The prompt is empty: describe the image you want."))
    if len(text) > max_chars:
        raise InvalidRequestError(tr("The prompt is {length} characters; the limit is {limit}. Shorten it.",
                                     length=len(text), limit=max_chars))
    return text


def guidance_value(value: object) -> float:
    """``value`` as a float in GUIDANCE_MIN..GUIDANCE_MAX; bools, strings and non-finite numbers are refused."""
    return real_number(tr("Guidance"), value, GUIDANCE_MIN, GUIDANCE_MAX)
