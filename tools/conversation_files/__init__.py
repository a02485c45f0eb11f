"""Conversation files: the Chat tab's Export JSON, Export Markdown and Load JSON, in the export format
docs/api.md describes ("Chat history and the export format")."""

from pathlib import Path

from neuron_backend.messages import read_catalog, register

# its Arabic joins the one catalog before any text is shown
register(read_catalog(Path(__file__).with_name("arabic.json")))
