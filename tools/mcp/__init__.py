"""``--mcp``: the chat, image, edit and warm-up status endpoints as MCP tools with strict schemas, served by
Gradio's MCP server (``tools.py``: the tools, without Gradio; ``server.py``: Gradio's MCP server given them;
``plugin.py``: the flag and the page hook)."""
