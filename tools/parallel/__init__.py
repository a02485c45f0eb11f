"""Tensor parallel (``--tp``, ``--tp-engine``): ``plugin.py`` reads the flags and hands the core a ``Sharding``,
``protocol.py`` joins the torchrun group and keeps the ranks in lockstep (imported only with ``--tp`` above 1)."""
