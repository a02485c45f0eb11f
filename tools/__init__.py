"""The plug-ins: what the showcase does not need to show a model, built on the core and never named by it.

Each folder is one plug-in with its ``plugin.py`` (``add_flags``, ``plug``; see neuron_backend/plugins.py), listed
in ``app.py``'s ``PLUGINS``: ``demo_models`` (the offline demo models, built for ``--models tiny``), ``remote``
(engines on other servers), ``cache`` (compile-cache bundles), ``aot``
(compiled forwards saved for a warm start), ``chat_batch`` (many chat users in one batch), ``parallel`` (one engine
sharded over torchrun ranks), ``openai_api``
(``/v1``), ``mcp``, ``login``, ``qa`` (the QA bench and the chat's feedback row); ``doctor.py`` is one too.
``device_check`` and ``lock.py`` are operator commands (``python -m tools.device_check``, ``python -m tools.lock``).
"""
