"""The QA bench: prompt sets x settings variants, reproducible cells, marks, reports and compare."""
