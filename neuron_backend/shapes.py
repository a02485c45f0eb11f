"""Declared static shapes, their readiness, and what every engine shares.

A request maps onto a typed shape key (``PromptBucket``, ``ImageSize``, ``EditSlot``) or is refused, never
discovered at run time. The surface every engine exposes: docs/architecture.md, "The engine surface".
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from typing import NamedTuple

from .errors import ConfigError, InvalidRequestError, PromptTooLongError, ShapeFailedError, ShapeNotReadyError
from .messages import Message, shown_value, tr

# ----- the declared shapes --------------------------------------------------------------------------
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


class PromptBucket(NamedTuple):
    """A chat prompt length bucket: prompts are left-padded to ``tokens``; written "prefill-64" in plain data."""

    tokens: int

    @property
    def label(self) -> str:
        return f"prefill-{self.tokens}"

    def __str__(self) -> str:
        return self.label


class EditSlot(NamedTuple):
    """An output size with ``references`` reference images (1 or more), each fitted to the size's
    reference size: one transformer sequence, one graph; written "1024x1024+2ref" in plain data."""

    size: ImageSize
    references: int

    @property
    def label(self) -> str:
        return f"{self.size.label}+{self.references}ref"

    def __str__(self) -> str:
        return self.label


ShapeKey = PromptBucket | ImageSize | EditSlot  # one static shape of one engine


def shape_keys(settings, engine: str) -> list[ShapeKey]:
    """The static shapes of an engine, in warm-up order (``settings``: a ``settings.Settings``).

    Image: every size first (text-to-image serves as early as before), then each reference count
    at each size."""
    if engine == "chat":
        return [PromptBucket(b) for b in settings.buckets]
    edits = [EditSlot(size, n) for n in settings.references if n for size in settings.sizes]
    return [*settings.sizes, *edits]


def image_shape(size: ImageSize, references: int) -> ImageSize | EditSlot:
    """The shape key of an image request at ``size`` with ``references`` reference images."""
    return EditSlot(size, references) if references else size


def parse_size(text: object) -> ImageSize:
    """Parse "WxH" into an ImageSize; raise InvalidRequestError saying what is allowed. A side of more digits
    than MAX_SIDE has is refused before ``int()`` (which raises past 4300 digits), echoed shortened."""
    if isinstance(text, ImageSize):
        return text
    if isinstance(text, (tuple, list)) and len(text) == 2 and all(isinstance(v, int) for v in text):
        width, height = text
    else:
        match = _SIZE_RE.match(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidRequestError(tr("Image size {text} is malformed: write it as WIDTHxHEIGHT, e.g. '1024x1024'.",
                                         text=shown_value(text)))
        if any(len(side.lstrip("0")) > len(str(MAX_SIDE)) for side in match.groups()):
            raise _invalid_size(shown_value(text.strip()))
        width, height = int(match.group(1)), int(match.group(2))
    for side in (width, height):
        if side <= 0 or side > MAX_SIDE or side % SIZE_MULTIPLE:
            raise _invalid_size(f"{_side(width)}x{_side(height)}")
    return ImageSize(width, height)


def _side(value: int) -> str:
    """A side as a size label shows it; a huge one by its digit count (str() raises past 4300 digits)."""
    return str(value) if abs(value) < 10**40 else f"<{int(abs(value).bit_length() * 0.30103) + 1} digits>"


def _invalid_size(size: str) -> InvalidRequestError:
    return InvalidRequestError(tr("Image size {size} is invalid: both sides must be multiples of {multiple} "
                                  "between {multiple} and {max_side}.", size=size, multiple=SIZE_MULTIPLE,
                                  max_side=MAX_SIDE))


def choose_bucket(prompt_tokens: int, buckets: tuple[int, ...]) -> int:
    """Return the smallest bucket that holds ``prompt_tokens`` tokens."""
    for bucket in buckets:
        if prompt_tokens <= bucket:
            return bucket
    raise PromptTooLongError(tr("The prompt is {tokens} tokens; the longest prompt this server accepts is {limit} "
                                "tokens. Shorten the message.", tokens=prompt_tokens, limit=buckets[-1]))


# ----- their readiness --------------------------------------------------------------------------------
PENDING, READY, FAILED = "pending", "ready", "failed"

ENGINE_WORDS = {"chat": tr("chat"), "image": tr("image")}  # engine names inside sentences, lower case


def engine_name(name: str) -> Message | str:
    """An engine's name inside a sentence ("chat"; Arabic on the page), as a message."""
    return ENGINE_WORDS.get(name, name)


@dataclass
class ShapeState:
    state: str = PENDING
    reason: str | None = None


class ShapeRegistry:
    """Thread-safe state of each declared shape of one engine. Once ``gated`` (the warm-up is planned), a
    request for a shape that is not ready is refused instead of compiling it on the request path."""

    def __init__(self, engine: str, keys: list[ShapeKey]):
        self.engine = engine
        self._states = {key: ShapeState() for key in keys}
        self._lock = threading.Lock()
        self.gated = False
        # shape -> why it runs (partly) eager: the compile error it fell back from (devices.compile_or_eager,
        # chat: which graphs failed, devices.GraphFallbacks)
        self.eager: dict[ShapeKey, str] = {}

    def keys(self) -> list[ShapeKey]:
        return list(self._states)

    def mark_ready(self, key: ShapeKey) -> None:
        with self._lock:
            self._states[key] = ShapeState(READY)

    def mark_failed(self, key: ShapeKey, reason: str) -> None:
        with self._lock:
            self._states[key] = ShapeState(FAILED, reason)

    def state(self, key: ShapeKey) -> ShapeState:
        with self._lock:
            return ShapeState(**vars(self._states[key]))

    def require(self, key: ShapeKey, label: str | None = None) -> None:
        """Raise unless ``key`` may serve a request now; ``label``: how the message names it (its key's label)."""
        state = self.state(key)
        label = label or str(key)
        if state.state == FAILED:
            raise ShapeFailedError(tr("{engine} shape {label} is unavailable: its warm-up failed ({reason}).",
                                      engine=engine_name(self.engine), label=label,
                                       reason=state.reason))
        if state.state == PENDING and self.gated:
            raise ShapeNotReadyError(tr("{engine} shape {label} is still warming up (compiling); try again soon.",
                                        engine=engine_name(self.engine), label=label), str(key))

    def snapshot(self) -> dict[str, dict]:
        """Plain data: each shape's state and reason, keyed by its label."""
        with self._lock:
            return {str(k): {"state": s.state, "reason": s.reason} for k, s in self._states.items()}


# ----- one job at a time --------------------------------------------------------------------------------
class SerialJobs:
    """One request at a time per engine, each with its own cancel event: callers block in ``job()`` until
    the running job ends (none is dropped); ``cancel()`` stops only the job running now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: threading.Event | None = None

    def job(self, cancel: threading.Event | None = None):
        """Context manager for one job; ``cancel`` lets the caller stop just its own request."""
        return _Job(self, cancel)

    def cancel(self) -> bool:
        """Ask the running job to stop; return whether one was running."""
        current = self._current
        if current is None:
            return False
        current.set()
        return True

    @property
    def busy(self) -> bool:
        return self._lock.locked()


class _Job:
    def __init__(self, owner: SerialJobs, cancel: threading.Event | None):
        self._owner = owner
        self.cancelled = cancel if cancel is not None else threading.Event()

    def __enter__(self) -> threading.Event:
        self._owner._lock.acquire()
        self._owner._current = self.cancelled
        return self.cancelled

    def __exit__(self, *exc) -> None:
        self._owner._current = None
        self._owner._lock.release()


# ----- reference images: how many a request may carry, at what size the pipeline takes them --------------------
PIPELINE_MAX_AREA = 1024 * 1024  # the pipeline resizes a reference over this area (pipeline_flux2_klein.py)
PIPELINE_MIN_SIDE = 64  # Flux2ImageProcessor.check_image_input refuses a side under this
MAX_REFERENCES = 4  # the most references --references may declare


def reference_size(output: ImageSize) -> ImageSize:
    """The size every reference of a request at ``output`` is fitted to: the output size, or within
    ``PIPELINE_MAX_AREA`` at its aspect with sides rounded down to multiples of 16."""
    width, height = output
    if width * height <= PIPELINE_MAX_AREA:
        return ImageSize(width, height)
    scale = math.sqrt(PIPELINE_MAX_AREA / (width * height))
    return ImageSize(max(SIZE_MULTIPLE, int(width * scale) // SIZE_MULTIPLE * SIZE_MULTIPLE),
                     max(SIZE_MULTIPLE, int(height * scale) // SIZE_MULTIPLE * SIZE_MULTIPLE))


def check_passes_unchanged(size: ImageSize) -> None:
    """Raise ValueError if the pipeline would resize a reference of ``size`` (a settings bug, not a user's)."""
    width, height = size
    if (width * height > PIPELINE_MAX_AREA or width % SIZE_MULTIPLE or height % SIZE_MULTIPLE
            or min(width, height) < PIPELINE_MIN_SIDE or max(width, height) > 8 * min(width, height)):
        raise ValueError(f"reference size {size} is not one the pipeline keeps unchanged")


def served_counts(counts: tuple[int, ...], sizes, given: bool) -> tuple[int, ...]:
    """The reference counts ``--references`` declares, checked: 0 among them, each 0..MAX_REFERENCES, and
    every size with a reference size the pipeline keeps unchanged (else ConfigError; when not ``given``,
    the preset's counts give way to text-to-image only)."""
    allowed = f"comma-separated counts from 0 to {MAX_REFERENCES} with 0 among them, e.g. 0,1,2"
    if 0 not in counts:
        raise ConfigError("--references", "0 (text-to-image) is missing", allowed)
    for count in counts:
        if not 0 <= count <= MAX_REFERENCES:
            raise ConfigError("--references", f"{count} is out of range", allowed)
    for size in sizes if max(counts) else ():
        try:
            check_passes_unchanged(reference_size(size))
        except ValueError:
            if not given:
                return (0,)
            raise ConfigError("--references", f"size {size.label} cannot take references (the pipeline needs "
                              "reference sides of 64 or more, at most 8:1)",
                              "--references 0, or sizes with sides of 64 or more") from None
    return counts
