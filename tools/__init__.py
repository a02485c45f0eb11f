"""The annex: what the showcase does not need to show a model, built on the core and never imported by it.

- ``tools.qa``: the QA bench (prompt sets x settings variants, marks, reports, compare), its tab and CLI;
- ``tools.cache``: compile-cache bundles (``python -m tools.cache``), a warm-up hook and the Export button;
- ``tools.doctor``: the first-run checklist of a Trainium host (``python -m tools.doctor``).

``app.py`` hands the annex's tabs, warm-up hooks and details to the core as plain values; ``bench/``
(benchmarks) sits beside it.
"""
