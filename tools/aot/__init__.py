"""Saved compiled forwards (``--chat-aot``, ``--image-aot``): ``plugin.py`` reads the flags and wraps an engine's
compiled forward, ``forward.py`` saves each compiled graph whole, signed, and loads it on a warm start."""
