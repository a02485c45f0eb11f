"""Conversation files as a plug-in: the Chat tab's Export JSON / Export Markdown / Load JSON row (``row.py``),
writing and checking the export document (``document.py``). No flags."""

from __future__ import annotations

from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings


def add_flags(parser) -> None:
    """None: the row is always there."""


def _files_row(backend, form):
    from .row import wire_conversation_files

    return wire_conversation_files(backend, form)


def plug(settings: Settings) -> Parts:
    return Parts(chat_extras=(_files_row,))
