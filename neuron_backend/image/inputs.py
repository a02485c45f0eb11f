"""Checks of the values an image request carries; each refusal says what is allowed."""

from __future__ import annotations

import math
import unicodedata
from numbers import Integral, Real

from ..errors import InvalidRequestError
from ..messages import Message, msg

GUIDANCE_MIN, GUIDANCE_MAX = 1.0, 20.0  # 1.0 means no classifier-free guidance


def clean_prompt(prompt: object, max_chars: int) -> str:
    """The prompt without control characters (newline and tab kept), stripped; refuse empty or long."""
    if not isinstance(prompt, str):
        raise InvalidRequestError(msg("err_image_prompt_type", kind=type(prompt).__name__))
    text = prompt.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc").strip()
    if not text:
        raise InvalidRequestError(msg("err_image_prompt_empty"))
    if len(text) > max_chars:
        raise InvalidRequestError(msg("err_image_prompt_long", length=len(text), limit=max_chars))
    return text


def whole_number(name: str | Message, value: object, low: int, high: int) -> int:
    """``value`` as an int in low..high; bools, floats and strings are refused.

    ``name`` is the field as the Image tab labels it (a Message such as ``msg("err_image_field_steps")``,
    so the Arabic refusal names the Arabic label).
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidRequestError(msg("err_image_whole_type", name=name, low=low, high=high, value=repr(value)))
    if not low <= int(value) <= high:
        raise InvalidRequestError(msg("err_image_whole_range", name=name, value=value, low=low, high=high))
    return int(value)


def guidance_value(value: object) -> float:
    """``value`` as a float in GUIDANCE_MIN..GUIDANCE_MAX; bools, strings and non-finite numbers are refused."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InvalidRequestError(msg("err_image_guidance_type", low=GUIDANCE_MIN, high=GUIDANCE_MAX,
                                      value=repr(value)))
    if not GUIDANCE_MIN <= float(value) <= GUIDANCE_MAX:
        raise InvalidRequestError(msg("err_image_guidance_range", value=value, low=GUIDANCE_MIN, high=GUIDANCE_MAX))
    return float(value)
