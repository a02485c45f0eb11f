"""The first-device check: one command a Trainium owner runs first, one JSON report to send back.

``python -m tools.doctor --device-check --out report.json [app flags]``: neuron-ls, versions, memory per
core, the doctor's checks, one chat bucket and one image size warmed up with their seconds, a compile-cache
bundle carried to a fresh cache root with the hits and misses it brought, and parity with CPU (greedy
tokens, one image's PSNR). ``report.py`` runs it; ``phase.py`` is each fresh process; ``parity.py`` compares.
"""
