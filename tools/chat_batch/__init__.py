"""Many chat users (``--chat-batch N``): ``plugin.py`` reads the flag and hands the chat engine a batch of N rows,
``batch.py`` serves up to N replies together in one ``generate()`` of exactly N rows."""

from pathlib import Path

from neuron_backend.messages import read_catalog, register

# the batch's Arabic joins the one catalog before any text is shown
register(read_catalog(Path(__file__).with_name("arabic.json")))
