"""The demo models: tiny random-weight stand-ins for Qwen3 and FLUX.2-klein, built offline (``build.py``) when
``--models tiny`` asks for them or ``--models auto`` falls back; ``plugin.py`` hands the core the builder."""
