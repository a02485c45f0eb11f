"""``--mcp``: the chat, image, edit and warm-up status endpoints as MCP tools with strict schemas, served by
Gradio's MCP server (``tools.py``: the tools, without Gradio; ``server.py``: Gradio's MCP server given them)."""

from __future__ import annotations

from neuron_backend.runtime import Backend

from .server import describe_tools, mcp_lifespan


def attach(demo, backend: Backend):
    """The page hook ``app.py`` hands to ``ui.serve`` under ``--mcp``: name and document the endpoints Gradio's
    MCP server lists, and return the lifespan that puts the app's tool handlers on that server."""
    describe_tools(demo, backend)
    return mcp_lifespan(demo, backend, backend.settings.auth)
