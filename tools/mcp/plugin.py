"""MCP as a plug-in: under ``--mcp``, Gradio's MCP server on, and a page hook that names and documents the
endpoints it lists and puts the app's tool handlers on it."""

from __future__ import annotations

from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings, add_flag


def add_flags(parser) -> None:
    add_flag(parser.add_argument_group("MCP (tools/mcp)"), "mcp", "bool",
             "also serve the chat, image and warm-up status tools over MCP at /gradio_api/mcp")


def attach(demo, backend):
    """The page hook: describe the endpoints Gradio's MCP server lists, and return the lifespan that puts the
    app's tool handlers on that server."""
    from .server import describe_tools, mcp_lifespan

    describe_tools(demo, backend)
    return mcp_lifespan(demo, backend, backend.settings.auth)


def plug(settings: Settings) -> Parts:
    return Parts(page_hooks=(attach,), launch={"mcp_server": True}) if settings.options.get("mcp") else Parts()
