"""Checks of the values an image request carries; each refusal says what is allowed."""

from __future__ import annotations

import math
import unicodedata
from numbers import Integral, Real

from ..errors import InvalidRequestError
from ..messages import Message, tr

GUIDANCE_MIN, GUIDANCE_MAX = 1.0, 20.0  # 1.0 means no classifier-free guidance


def clean_prompt(prompt: object, max_chars: int) -> str:
    """The prompt without control characters (newline and tab kept), stripped; refuse empty or long."""
    if not isinstance(prompt, str):
        raise InvalidRequestError(tr("The prompt must be text, not {kind}.", kind=type(prompt).__name__))
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
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidRequestError(tr("{name} must be a whole number from {low} to {high}, not {value}.",
                                     name=name, low=low, high=high, value=repr(value)))
    if not low <= int(value) <= high:
        raise InvalidRequestError(tr("{name} {value} is out of range: use a whole number from {low} to {high}.",
                                     name=name, value=value, low=low, high=high))
    return int(value)


def guidance_value(value: object) -> float:
    """``value`` as a float in GUIDANCE_MIN..GUIDANCE_MAX; bools, strings and non-finite numbers are refused."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InvalidRequestError(tr("Guidance must be a number from {low} to {high}, not {value}.",
                                     low=GUIDANCE_MIN, high=GUIDANCE_MAX,
                                      value=repr(value)))
    if not GUIDANCE_MIN <= float(value) <= GUIDANCE_MAX:
        raise InvalidRequestError(tr("Guidance {value} is out of range: use {low} to {high}.",
                                     value=value, low=GUIDANCE_MIN, high=GUIDANCE_MAX))
    return float(value)
