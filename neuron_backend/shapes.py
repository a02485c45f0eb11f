"""Declared static shapes: image sizes and chat prompt buckets.

Neuron compiles one graph per input shape, so shapes are data in the settings and every
request is mapped onto one of them (or refused) here, never discovered at run time.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from .errors import InvalidRequestError, PromptTooLongError
from .messages import tr

# FLUX.2's VAE downsamples by 8 and the transformer patchifies by 2: sides are multiples of 16.
SIZE_MULTIPLE = 16
MAX_SIDE = 4096
_SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


class ImageSize(NamedTuple):
    """A width x height pair, written "WxH" everywhere users see it."""

    width: int
    height: int

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def aspect(self) -> str:
        """The reduced aspect ratio, e.g. "16:9"-like "7:4" for 1344x768."""
        g = math.gcd(self.width, self.height)
        return f"{self.width // g}:{self.height // g}"

    def __str__(self) -> str:
        return self.label


def parse_size(text: object) -> ImageSize:
    """Parse "WxH" into an ImageSize; raise InvalidRequestError saying what is allowed."""
    if isinstance(text, ImageSize):
        return text
    if isinstance(text, (tuple, list)) and len(text) == 2 and all(isinstance(v, int) for v in text):
        width, height = text
    else:
        match = _SIZE_RE.match(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidRequestError(tr("Image size {text} is malformed: write it as WIDTHxHEIGHT, e.g. '1024x1024'.",
                                         text=repr(text)))
        width, height = int(match.group(1)), int(match.group(2))
    for side in (width, height):
        if side <= 0 or side > MAX_SIDE or side % SIZE_MULTIPLE:
            raise InvalidRequestError(tr("Image size {size} is invalid: both sides must be multiples of {multiple} "
                                         "between {multiple} and "
                                         "{max_side}.", size=f"{width}x{height}", multiple=SIZE_MULTIPLE,
                                          max_side=MAX_SIDE))
    return ImageSize(width, height)


def choose_bucket(prompt_tokens: int, buckets: tuple[int, ...]) -> int:
    """Return the smallest bucket that holds ``prompt_tokens`` tokens."""
    for bucket in buckets:
        if prompt_tokens <= bucket:
            return bucket
    raise PromptTooLongError(tr("The prompt is {tokens} tokens; the longest prompt this server accepts is {limit} "
                                "tokens. Shorten the message.", tokens=prompt_tokens, limit=buckets[-1]))
