"""The QA bench: prompt sets x settings variants, reproducible cells, marks, reports and compare."""

from . import arabic  # noqa: F401 - the bench's Arabic joins the one catalog before any text is shown
