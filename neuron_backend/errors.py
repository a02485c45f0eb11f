"""Errors a user can cause or fix. Each message says what is allowed or what to do.

The backend raises these; the UI turns them into ``gr.Error`` at the boundary only.
"""

from __future__ import annotations

import errno

from .messages import Message, tr


class ShowcaseError(Exception):
    """Base class: the message is meant to be shown to the user as it is."""


class ConfigError(ShowcaseError):
    """A start-up setting is invalid; the message names the flag and the allowed values."""

    def __init__(self, flag: str, problem: str, allowed: str | None = None):
        self.flag = flag
        msg = f"{flag}: {problem}"
        if allowed:
            msg += f" (allowed: {allowed})"
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
