"""Errors a user can cause or fix. Each message says what is allowed or what to do.

The backend raises these; the UI turns them into ``gr.Error`` at the boundary only.
"""

from __future__ import annotations


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
