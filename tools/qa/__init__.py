"""The QA bench: prompt sets x settings variants, reproducible cells, marks, reports and compare."""

from pathlib import Path

from neuron_backend.messages import read_catalog, register

# the bench's Arabic joins the one catalog before any text is shown
register(read_catalog(Path(__file__).with_name("arabic.json")))
