"""``--mcp``: the app's tools (tools/mcp/tools.py) served through Gradio's MCP server (``launch(mcp_server=True)``).

Transport: streamable HTTP at ``/gradio_api/mcp/``, which ``/gradio_api/mcp`` redirects to (307; the
docs give that form: the MCP Inspector CLI reads a path that ends in /mcp as HTTP), and SSE at
``/gradio_api/mcp/sse``.

Gradio 6.31's server lists schemas made from type hints and returns Python's ``str()`` of each
result, so at start-up its ``tools/list`` and ``tools/call`` handlers are replaced: the list gives
each tool's own input and output schemas; a call checks its arguments, runs the endpoint the way
Gradio does (queued endpoints through a ``gradio_client`` loopback to its own URL, with progress
notifications when the client asks; the others in-process), and returns JSON ``structuredContent``
plus one image block per PNG, read from the file as the app wrote it. A tool's base64 file arguments
(edit_image's references) are written to a temporary folder and go to the endpoint as files the loopback
uploads, as any API client's would; the folder is removed once the call is over.

With ``--auth`` the loopback client must log in: ``_logged_in_client`` gives it the credentials
(Gradio 6.31 has no option for it).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import tempfile
from pathlib import Path

import gradio as gr
from anyio import BrokenResourceError, CancelScope, ClosedResourceError, get_cancelled_exc_class, sleep
from anyio.to_thread import run_sync
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from neuron_backend.errors import ShowcaseError
from neuron_backend.messages import tr
from neuron_backend.runtime import Backend

from .tools import Tool, as_text, file_arguments, image_files, mcp_tools, structured

log = logging.getLogger(__name__)

RESULT_POLL_S = 0.05  # how often a tool call without progress looks whether its job is done


def mcp_lifespan(demo: gr.Blocks, backend: Backend, auth: tuple[str, str] | None):
    """A FastAPI lifespan that puts the app's tool handlers (and, with ``auth``, the loopback's login) on
    Gradio's MCP server: the server object exists once the app is built, and the lifespan runs at start-up."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server = getattr(demo, "mcp_server_obj", None)
        if server is not None:
            if auth is not None:
                server._get_or_create_client = lambda: _logged_in_client(server, auth)
            serve_tools(server, mcp_tools(backend))
        yield

    return lifespan


def serve_tools(server, tools: dict[str, Tool]) -> None:
    """Replace the ``tools/list`` and ``tools/call`` handlers of Gradio's MCP server ``server``."""
    from mcp import types

    lowlevel = server.mcp_server
    by_name = {server.tool_prefix + tool.name: tool for tool in tools.values()
               if server.tool_prefix + tool.name in server.tool_to_endpoint}
    original_schema = server.get_input_schema

    def input_schema(tool_name: str, parameters: dict | None = None):  # also what /gradio_api/mcp/schema shows
        tool = by_name.get(tool_name)
        return (tool.input_schema, []) if tool else original_schema(tool_name, parameters)

    server.get_input_schema = input_schema

    @lowlevel.list_tools()
    async def list_tools() -> list[types.Tool]:
        selected = server.get_selected_tools_from_request()
        return [types.Tool(name=name, description=tool.summary, inputSchema=tool.input_schema,
                           outputSchema=tool.output)
                for name, tool in by_name.items() if selected is None or name in selected]

    @lowlevel.call_tool(validate_input=False)  # the arguments are checked here, with messages that say what is allowed
    async def call_tool(name: str, arguments: dict) -> types.CallToolResult:
        selected = server.get_selected_tools_from_request()
        tool = by_name.get(name) if selected is None or name in selected else None
        try:
            if tool is None:
                raise ShowcaseError(tr("There is no tool {name}; this server has {tools}.",
                                       name=name, tools=", ".join(by_name)))
            with tempfile.TemporaryDirectory(prefix="mcp-files-") as folder:
                outputs = await _run(server, name, _with_files(tool, tool.arguments(arguments), Path(folder)))
            result = structured(tool, outputs)
        except (ShowcaseError, AppError, RuntimeError) as exc:  # ours, and the endpoint's refusal (its message)
            return _refused(types, str(getattr(exc, "message", exc)))
        except (ClosedResourceError, BrokenResourceError):  # the client went away: its job was cancelled (_run)
            log.info("MCP tool %s: the client went away; its job was cancelled", name)
            return _refused(types, tr("The client went away; the call was cancelled."))
        except Exception:  # noqa: BLE001 - the log has the details, the client a plain message
            log.exception("MCP tool %s failed", name)
            return _refused(types, tr("The tool failed on the server; its log has the details."))
        images = [types.ImageContent(type="image", data=_png_base64(file), mimeType="image/png")
                  for file in image_files(tool, outputs)]
        return types.CallToolResult(content=[types.TextContent(type="text", text=as_text(result)), *images],
                                    structuredContent=result)


def _with_files(tool: Tool, values: dict, folder: Path) -> dict:
    """``values`` with each base64 file argument written under ``folder`` and given as a file to upload."""
    for name, files in file_arguments(tool, values).items():
        for file_name, data in files:
            (folder / file_name).write_bytes(data)
        values[name] = [handle_file(str(folder / file_name)) for file_name, _ in files]
    return values


def _refused(types, message: str):
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], isError=True)


async def _run(server, name: str, arguments: dict) -> list:
    """The endpoint's outputs for ``arguments``: the same steps as Gradio 6.31's own ``call_tool``."""
    from gradio.state_holder import SessionState

    endpoint, inputs, headers, block_fn = server._prepare_tool_call_args(name, arguments)
    inputs = server.insert_empty_state(block_fn.inputs, inputs)
    context = server.mcp_server.request_context
    if not block_fn.queue:  # /status: in-process
        raw = await server.blocks.process_api(block_fn=block_fn, inputs=inputs, state=SessionState(server.blocks),
                                              request=context.request)
        outputs = raw["data"]
    else:
        token = context.meta.progressToken if context.meta is not None else None
        client = await run_sync(server._get_or_create_client)
        job = client.submit(*inputs, api_name=endpoint, headers=headers)
        try:
            if token is None:
                outputs = [await _result(job)]
                # a multi-output result comes back as one tuple (generate_image's PNG and parameters)
                outputs = list(outputs[0]) if len(outputs) == 1 and isinstance(outputs[0], tuple) else outputs
            else:
                outputs = await server._execute_tool_with_progress(job, token)
        except (get_cancelled_exc_class(), ClosedResourceError, BrokenResourceError):
            # The MCP client sent notifications/cancelled or went away: cancel the Gradio job as the page's
            # Stop does (its handler then stops the image at the next step). A client that went away
            # cancels this handler once its transport has closed; a progress notification sent in between
            # finds the stream closed instead. ``job.cancel`` posts to this server, so it runs on a worker
            # thread, shielded from the cancellation being delivered.
            with CancelScope(shield=True):
                await run_sync(job.cancel)
            raise
    return server.pop_returned_state(block_fn.outputs, outputs)


async def _result(job):
    """The job's result once it is done, or what it raised.

    Polled, not ``run_sync(job.result)``: a worker thread that waits for the result cannot be cancelled,
    so the tool handler would not see its client's cancel until the whole job had run.
    """
    while not job.done():
        await sleep(RESULT_POLL_S)
    return job.result()


def _png_base64(file: dict) -> str:
    """A PNG the endpoint wrote, as base64 of its bytes (its embedded parameters kept)."""
    return base64.b64encode(Path(file["path"]).read_bytes()).decode("ascii")


def _logged_in_client(server, auth: tuple[str, str]):
    from gradio_client import Client

    if server._client_instance is None:  # same options as Gradio's own factory, plus the login
        server._client_instance = Client(server.local_url, auth=auth, download_files=False, verbose=False,
                                         analytics_enabled=False, ssl_verify=False, _skip_components=False,
                                         headers={"x-gradio-user": "mcp"})
    return server._client_instance


def describe_tools(demo: gr.Blocks, backend: Backend) -> list[str]:
    """Name and document the endpoints Gradio's MCP server lists (call before launch); return the tool names.

    Other public endpoints (e.g. the image tab's PNG paste-back) stay API endpoints but are not
    listed as tools: Gradio lists a function as a tool unless its ``_mcp_type`` says otherwise.
    """
    tools = mcp_tools(backend)
    named = []
    for block_fn in demo.fns.values():
        if block_fn.fn is None or block_fn.api_name is None or block_fn.api_visibility != "public":
            continue
        if block_fn.api_name in tools:
            tool = tools[block_fn.api_name]
            block_fn.fn.__name__, block_fn.fn.__doc__ = tool.name, tool.docstring
            named.append(tool.name)
        else:
            block_fn.fn._mcp_type = "api-only"
    return named
