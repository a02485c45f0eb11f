"""Paste-back: a PNG dropped on the Image tab (or sent to ``/paste_png``) fills the form with the settings it was
made with, read from its text chunks and checked against this server."""

from pathlib import Path

from neuron_backend.messages import read_catalog, register

# its Arabic joins the one catalog before any text is shown
register(read_catalog(Path(__file__).with_name("arabic.json")))
