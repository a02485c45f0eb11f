"""The OpenAI-compatible API under ``/v1``, for the ecosystem's clients (the ``openai`` SDK, lm-evaluation-harness,
promptfoo): ``app.py`` adds its routes (``routes.openai_routes``) beside the core's probes."""
