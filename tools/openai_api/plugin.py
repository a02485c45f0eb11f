"""The OpenAI-compatible ``/v1`` API as a plug-in: its routes beside the page, its error answers in
OpenAI's shape (a layer around the core's body limit, entered only by ``/v1`` requests), and ``--api-key``."""

from __future__ import annotations

from neuron_backend.errors import ConfigError
from neuron_backend.plugins import Layer, Parts
from neuron_backend.settings import Settings, add_flag


def add_flags(parser) -> None:
    add_flag(parser.add_argument_group("OpenAI-compatible /v1 (tools/openai_api)"), "api-key", "str",
             "bearer key the OpenAI-compatible /v1 routes ask for (with --auth, /v1 needs one)")


def api_key(settings: Settings) -> str | None:
    """--api-key, checked: one word of printable ASCII."""
    if "api_key" not in settings.options:
        return None
    key = str(settings.options["api_key"])
    if not key or any(c.isspace() for c in key) or not key.isprintable() or not key.isascii():
        raise ConfigError("--api-key", "expected one word of printable ASCII", "e.g. the output of: "
                          "python -c 'import secrets; print(secrets.token_urlsafe())'")
    return key


def plug(settings: Settings) -> Parts:
    key = api_key(settings)

    def routes(backend):
        from .routes import openai_routes

        return openai_routes(backend, key)

    from .errors import PREFIX, OpenAIErrors

    return Parts(routes=(routes,), middleware=(Layer(OpenAIErrors, prefix=PREFIX),))
