"""Paste-back as a plug-in: the Image tab's "Restore settings from a PNG" box and ``/paste_png`` (``drop_box.py``),
reading a PNG's settings (``png_settings.py``). No flags."""

from __future__ import annotations

from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings


def add_flags(parser) -> None:
    """None: the drop box is always there."""


def _drop_box(backend, form):
    from .drop_box import build_drop_box

    return build_drop_box(backend, form)


def plug(settings: Settings) -> Parts:
    return Parts(image_extras=(_drop_box,))
