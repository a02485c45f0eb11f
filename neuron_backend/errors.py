"""Errors a user can cause or fix. Each message says what is allowed or what to do.

The backend raises these; the UI turns them into ``gr.Error`` at the boundary only. ``whole_number``,
``real_number`` and ``true_or_false`` give chat and image the same refusal wherever a value is wrong.
"""

from __future__ import annotations

import errno
import math
from numbers import Integral, Real

from .messages import Message, shown_value, tr


class ShowcaseError(Exception):
    """Base class: the message is meant to be shown to the user as it is."""


class ConfigError(ShowcaseError):
    """A start-up setting is invalid; the message names the flag and the allowed values."""

    def __init__(self, flag: str, problem: str, allowed: str | None = None):
        self.flag = flag
        msg = f"{flag}: {problem}"
        if allowed:
            msg += f" (allowed: {allowed})"
        elif isinstance(problem, Message):  # written with tr(): the page shows it in Arabic too
            msg = tr("{flag}: {problem}", flag=flag, problem=problem)
        super().__init__(msg)


class DeviceUnavailableError(ConfigError):
    """The requested device does not exist on this host."""


class InvalidRequestError(ShowcaseError, ValueError):
    """A request argument is out of range or malformed."""


class UnsupportedSizeError(InvalidRequestError):
    """An image size that is not one of the precompiled sizes."""


class PromptTooLongError(InvalidRequestError):
    """A single chat message does not fit the largest prompt bucket."""


class ShapeNotReadyError(ShowcaseError):
    """A static shape is still warming up (compiling); retry once it is ready."""

    def __init__(self, message: str, shape: str):
        self.shape = shape
        super().__init__(message)


class ShapeFailedError(ShowcaseError):
    """A static shape failed to warm up and is unavailable."""


class DeviceMemoryError(ShapeFailedError):
    """A shape's warm-up ran out of device memory: not a compile failure, and eager would need as much."""


class EngineUnavailableError(ShowcaseError):
    """An engine is disabled or failed to load."""


class IncompatibleModelError(EngineUnavailableError):
    """A model's parts do not fit the pipeline that runs them (e.g. too few text-encoder layers)."""


class BusyError(ShowcaseError):
    """Too many requests are waiting; try again shortly."""


class CancelledError(ShowcaseError):
    """The request was stopped by the user."""


class CacheBundleError(ShowcaseError):
    """A compile-cache bundle cannot be made or installed; the message says why and what to do."""


class StorageError(ShowcaseError, OSError):
    """A folder under the cache root (``--cache-dir``) could not be written; the message says what to do.

    An ``OSError`` too, so code that handles a failed write as one keeps doing so.
    """


def storage_reason(exc: OSError) -> Message:
    """Why a write under the cache root failed and what the operator can do, from ``exc.errno`` alone.

    Never Python's own text (``[Errno 28] No space left on device``) or a server path: the page shows this
    to anonymous visitors; the log keeps both.
    """
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return tr("its disk is full: free space there, or start the app with --cache-dir on another disk")
    if exc.errno == errno.EROFS:
        return tr("its disk is read-only: make it writable, or start the app with --cache-dir on a writable disk")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return tr("the server may not write there: give it write access, or start the app with --cache-dir "
                  "on a folder it may write")
    return tr("the disk refused the write: check it, or start the app with --cache-dir on another disk")


def whole_number(name: str | Message, value: object, low: int, high: int) -> int:
    """``value`` as an int in low..high; bools, floats, strings and integers of over 40 digits are refused.
    ``name`` is the field as the caller shows it (a Message such as ``tr("Steps")`` is translated)."""
    huge = isinstance(value, Integral) and abs(int(value)) > 10**40  # str() of it may raise, past 4300 digits
    if isinstance(value, bool) or not isinstance(value, Integral) or huge:
        raise InvalidRequestError(tr("{name} must be a whole number from {low} to {high}, not {value}.",
                                     name=name, low=low, high=high, value=shown_value(value)))
    if not low <= int(value) <= high:
        raise InvalidRequestError(tr("{name} {value} is out of range: use a whole number from {low} to {high}.",
                                     name=name, value=value, low=low, high=high))
    return int(value)


def real_number(name: str | Message, value: object, low: float, high: float, above: bool = False,
                hint: Message | None = None) -> float:
    """``value`` as a finite float in low..high (``above``: more than low); bools and strings are refused. A
    ``hint`` follows the refusal (what to use instead)."""
    number = None
    if not isinstance(value, bool) and isinstance(value, Real):
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            number = None
    finite = number is not None and math.isfinite(number)
    if finite and (low < number if above else low <= number) and number <= high:
        return number
    shown = {"name": name, "low": f"{low:g}", "high": f"{high:g}"}
    if not finite:
        refusal = tr("{name} must be a number above {low} and at most {high}, not {value}.", value=shown_value(value),
                     **shown) if above else tr("{name} must be a number from {low} to {high}, not {value}.",
                                               value=shown_value(value), **shown)
    else:
        refusal = tr("{name} {value} is out of range: use a number above {low} and at most {high}.", value=value,
                     **shown) if above else tr("{name} {value} is out of range: use a number from {low} to {high}.",
                                               value=value, **shown)
    raise InvalidRequestError(tr("{refusal} {hint}", refusal=refusal, hint=hint) if hint else refusal)


def true_or_false(name: str | Message, value: object) -> bool:
    """``value`` if it is a bool; anything else (1, "yes") is refused."""
    if not isinstance(value, bool):
        raise InvalidRequestError(tr("{name} must be true or false, not {value}.", name=name, value=shown_value(value)))
    return value
