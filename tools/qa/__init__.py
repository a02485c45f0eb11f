"""The QA bench: prompt sets x settings variants, reproducible cells, marks, reports and compare."""

from neuron_backend.messages import register

from .messages import MESSAGES

register(MESSAGES)  # the bench's backend messages join the core's table before any is built

