"""Checks of the values an image request carries; each refusal says what is allowed."""

from __future__ import annotations

import math
import re
import unicodedata
from numbers import Integral, Real

from ..errors import InvalidRequestError
from ..messages import Message, shown_value, tr

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


def whole_number(name: str | Message, value: object, low: int, high: int) -> int:
    """``value`` as an int in low..high; bools, floats and strings are refused.

    ``name`` is the field as the Image tab labels it (a Message such as ``tr("Steps")``,
    so the Arabic refusal names the Arabic label).
    """
    huge = isinstance(value, Integral) and abs(int(value)) > 10**40  # str() of it may raise, past 4300 digits
    if isinstance(value, bool) or not isinstance(value, Integral) or huge:
        raise InvalidRequestError(tr("{name} must be a whole number from {low} to {high}, not {value}.",
                                     name=name, low=low, high=high, value=shown_value(value)))
    if not low <= int(value) <= high:
        raise InvalidRequestError(tr("{name} {value} is out of range: use a whole number from {low} to {high}.",
                                     name=name, value=value, low=low, high=high))
    return int(value)


def guidance_value(value: object) -> float:
    """``value`` as a float in GUIDANCE_MIN..GUIDANCE_MAX; bools, strings and non-finite numbers are refused."""
    number = None
    if not isinstance(value, bool) and isinstance(value, Real):
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            number = None
    if number is None or not math.isfinite(number):
        raise InvalidRequestError(tr("Guidance must be a number from {low} to {high}, not {value}.",
                                     low=GUIDANCE_MIN, high=GUIDANCE_MAX, value=shown_value(value)))
    if not GUIDANCE_MIN <= number <= GUIDANCE_MAX:
        raise InvalidRequestError(tr("Guidance {value} is out of range: use {low} to {high}.",
                                     value=value, low=GUIDANCE_MIN, high=GUIDANCE_MAX))
    return number
