"""Compile-cache bundles as a plug-in: ``--cache-bundle`` installed before warm-up, the cache recorded after it
(``warm_start.WarmStart``), and the operator's Export button in the warm-up details (``panel.build_export``)."""

from __future__ import annotations

import functools
import re

from neuron_backend.errors import ConfigError
from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings, add_flag

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def add_flags(parser) -> None:
    group = parser.add_argument_group("compile-cache bundles (tools/cache)")
    add_flag(group, "cache-bundle", "str", "compile-cache bundle to install at start: a .tar file, a folder holding "
                                           "one, or hf://owner/repo[@revision] (see python -m tools.cache); a bundle "
                                           "is code: needs --cache-bundle-sha256")
    add_flag(group, "cache-bundle-sha256", "str", "sha256 of the --cache-bundle archive as tools.cache export "
                                                  "printed it; no other")


def bundle_flags(settings: Settings) -> tuple[str | None, str | None]:
    """(--cache-bundle, --cache-bundle-sha256), checked: a bundle is installed only with its sha256 pinned."""
    given = settings.options
    source = str(given.get("cache_bundle", "")).strip() or None
    sha256 = str(given.get("cache_bundle_sha256", "")).strip().lower() or None
    if source and not sha256:  # inductor's cache entries are pickles: they run on lookup
        raise ConfigError("--cache-bundle", "a bundle is code, installed only when its origin is pinned",
                          "--cache-bundle-sha256 <sha256 of the archive>, as python -m tools.cache export "
                          "printed it where the bundle was made; python -m tools.cache show PATH prints it")
    if sha256 and not SHA256_RE.match(sha256):
        raise ConfigError("--cache-bundle-sha256", f"{sha256!r} is not a sha256", "64 hex digits")
    if sha256 and not source:
        raise ConfigError("--cache-bundle-sha256", "pins a bundle, but no --cache-bundle is given",
                          "--cache-bundle PATH with it, or neither")
    return source, sha256


def _export(backend) -> None:
    from .panel import build_export

    build_export(backend)


def _warm_start(backend, source: str | None, sha256: str | None):
    from .warm_start import WarmStart

    return WarmStart(backend, source, sha256)


def plug(settings: Settings) -> Parts:
    source, sha256 = bundle_flags(settings)
    return Parts(hooks=(functools.partial(_warm_start, source=source, sha256=sha256),), details=(_export,))
