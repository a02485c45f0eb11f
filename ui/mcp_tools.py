"""``--mcp``: the public endpoints as MCP tools over Gradio's MCP server (``launch(mcp_server=True)``).

Gradio turns every public endpoint into a tool named after its function, described by its
docstring ("Args:" lines describe the parameters). Here the three endpoints get names and
docstrings an agent can act on, built from the settings when the page is made (allowed sizes,
step and token limits, what comes back):

- ``chat``            /chat: one reply (the tool returns the last update of the stream)
- ``generate_image``  /generate_image: the PNG (an MCP image) and its parameters
- ``warmup_status``   /status: what is ready, what is still compiling, the recompile alarm

Transport: streamable HTTP at ``/gradio_api/mcp/`` (SSE at ``/gradio_api/mcp/sse``). Gradio calls a
queued tool through a ``gradio_client`` loopback to its own URL; with ``--auth`` that client must
log in, so ``loopback_login`` gives it the credentials (Gradio 6.31 has no option for it), and
unwraps multi-output results so the image comes back as an MCP image with or without a progress token.
"""

from __future__ import annotations

import contextlib

import gradio as gr

from neuron_backend.runtime import Backend


def _doc(summary: str, params: dict[str, str]) -> str:
    """A docstring in the form Gradio's MCP server parses: summary, then one "name: description" per line."""
    return summary + "\n\nArgs:\n" + "".join(f"    {name}: {text}\n" for name, text in params.items())


def tool_docs(backend: Backend) -> dict[str, tuple[str, str]]:
    """api_name -> (tool name, docstring) for the endpoints that become MCP tools."""
    s = backend.settings
    sizes = ", ".join(size.label for size in s.sizes)
    seed = "a whole number from 0 to 4294967295 for a reproducible result; empty for random"
    chat = _doc(
        f"Chat with {backend.model_id('chat')}: send one user message, get the assistant's reply. "
        "The reply comes back as one object: answer (the reply text), reasoning (the model's thinking, empty "
        "unless thinking is true), done, dropped_turns (old turns left out to fit the context) and stats "
        "(prompt_tokens, bucket, new_tokens, time_to_first_token_s, tokens_per_s, seed, ...). The server keeps "
        "no memory between calls: pass earlier turns in history. While the chat engine is still warming up "
        "the call is refused with a message that says when to retry (warmup_status tells).",
        {"message": f"the user's message (at most {s.max_prompt_chars} characters).",
         "history": 'earlier turns, oldest first, as objects {"role": "user" or "assistant", "content": text}; '
                    f"empty for a new chat. The oldest turns are dropped when the prompt exceeds {s.buckets[-1]} "
                    "tokens.",
         "system_prompt": "optional system prompt.",
         "thinking": "true to let the model reason before answering (Qwen3 thinking mode; slower).",
         "temperature": "sampling temperature, above 0 and at most 2 (default 0.6 with thinking, else 0.7).",
         "top_p": "nucleus sampling, above 0 and at most 1 (default 0.95 with thinking, else 0.8).",
         "top_k": "top-k sampling, 0 (off) or more (default 20).",
         "max_new_tokens": f"most tokens in the reply, 1 to {s.max_new_tokens} (default {s.max_new_tokens}).",
         "greedy": "true for deterministic greedy decoding (temperature, top_p and top_k are then ignored).",
         "seed": seed + "."})
    image = _doc(
        f"Generate one image from a text prompt with {backend.model_id('image')}; returns the PNG. "
        f"Only these precompiled sizes exist on this server: {sizes} (width x height); any other size is "
        "refused. The result is the PNG image and a JSON object of its parameters (prompt, size, steps, seed, "
        "guidance, seconds); the PNG embeds the same parameters. A size still compiling is refused with its "
        "expected wait (warmup_status tells).",
        {"prompt": f"what to draw (at most {s.max_prompt_chars} characters).",
         "size": f"one of {sizes} (default {s.sizes[0].label}).",
         "steps": f"denoising steps, 1 to {s.max_steps} (default {s.default_steps}).",
         "seed": seed + " (the seed used is in the returned parameters).",
         "guidance": "guidance scale; empty for the model's default (a distilled model such as FLUX.2-klein "
                     "ignores it)."})
    status = ("The server's warm-up status: whether every engine is ready and what is still compiling. "
              "Returns an object with ready (true once every declared shape is compiled), progress (0 to 1), "
              "eta_s (seconds until ready, when known), failed (task names), compiles_since_ready (should stay "
              "0), engines (chat and image: disabled, loading, ready or failed) and per-task details. Call it "
              "when chat or generate_image is refused as still warming up.")
    return {"chat": ("chat", chat), "generate_image": ("generate_image", image), "status": ("warmup_status", status)}


def describe_tools(demo: gr.Blocks, backend: Backend) -> list[str]:
    """Name and document the endpoints Gradio's MCP server lists (call before launch); return the tool names.

    Other public endpoints (e.g. the image tab's PNG paste-back) stay API endpoints but are not
    listed as tools: Gradio lists a function as a tool unless its ``_mcp_type`` says otherwise.
    """
    docs = tool_docs(backend)
    named = []
    for block_fn in demo.fns.values():
        if block_fn.fn is None or block_fn.api_name is None or block_fn.api_visibility != "public":
            continue
        if block_fn.api_name in docs:
            name, doc = docs[block_fn.api_name]
            block_fn.fn.__name__, block_fn.fn.__doc__ = name, doc
            named.append(name)
        else:
            block_fn.fn._mcp_type = "api-only"
    return named


def loopback_login(demo: gr.Blocks, auth: tuple[str, str] | None):
    """A FastAPI lifespan that makes the MCP server's loopback client log in with ``auth``.

    Gradio's MCP server calls queued tools through a ``gradio_client.Client`` of its own URL,
    created on the first call without credentials; with ``--auth`` every such call would be
    refused. The server object exists once the app is built, so the lifespan (run at start-up)
    replaces its client factory with one that logs in.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server = getattr(demo, "mcp_server_obj", None)
        if server is not None:
            if auth is not None:
                server._get_or_create_client = lambda: _logged_in_client(server, auth)
            server._execute_tool_without_progress = _outputs_as_list(server._execute_tool_without_progress)
        yield

    return lifespan


def _outputs_as_list(execute):
    """Gradio 6.31 wraps a multi-output result (a tuple) in a list when the client sends no progress
    token, so the PNG of generate_image came back as the text of a tuple, not as an MCP image; unwrap it."""

    async def without_progress(job):
        outputs = await execute(job)
        return list(outputs[0]) if len(outputs) == 1 and isinstance(outputs[0], tuple) else outputs

    return without_progress


def _logged_in_client(server, auth: tuple[str, str]):
    from gradio_client import Client

    if server._client_instance is None:  # same options as Gradio's own factory, plus the login
        server._client_instance = Client(server.local_url, auth=auth, download_files=False, verbose=False,
                                         analytics_enabled=False, ssl_verify=False, _skip_components=False,
                                         headers={"x-gradio-user": "mcp"})
    return server._client_instance
