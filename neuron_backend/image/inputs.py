"""Checks of the values an image request carries; each refusal says what is allowed."""

from __future__ import annotations

import math
import unicodedata
from numbers import Integral, Real

from ..errors import InvalidRequestError

GUIDANCE_MIN, GUIDANCE_MAX = 1.0, 20.0  # 1.0 means no classifier-free guidance


def clean_prompt(prompt: object, max_chars: int) -> str:
    """The prompt without control characters (newline and tab kept), stripped; refuse empty or long."""
    if not isinstance(prompt, str):
        raise InvalidRequestError(f"The prompt must be text, not {type(prompt).__name__}.")
    text = prompt.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) != "Cc").strip()
    if not text:
        raise InvalidRequestError("The prompt is empty: describe the image you want.")
    if len(text) > max_chars:
        raise InvalidRequestError(f"The prompt is {len(text)} characters; the limit is {max_chars}. Shorten it.")
    return text


def whole_number(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in low..high; bools, floats and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidRequestError(f"{name} must be a whole number from {low} to {high}, not {value!r}.")
    if not low <= int(value) <= high:
        raise InvalidRequestError(f"{name} {value} is out of range: use a whole number from {low} to {high}.")
    return int(value)


def guidance_value(value: object) -> float:
    """``value`` as a float in GUIDANCE_MIN..GUIDANCE_MAX; bools, strings and non-finite numbers are refused."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InvalidRequestError(f"Guidance must be a number from {GUIDANCE_MIN} to {GUIDANCE_MAX}, not {value!r}.")
    if not GUIDANCE_MIN <= float(value) <= GUIDANCE_MAX:
        raise InvalidRequestError(f"Guidance {value} is out of range: use {GUIDANCE_MIN} to {GUIDANCE_MAX}.")
    return float(value)
