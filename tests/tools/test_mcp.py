"""MCP tools as agents call them: the official ``mcp`` client against a running app (``--mcp``), and each
tool's input schema against the subset of JSON Schema that strict function calling takes.

The subset checked (``strict_problems``, ``parameter_problems``): what OpenAI's strict function calling
requires, which also keeps clients that convert text arguments by a property's ``type`` (the MCP
Inspector CLI) and Gemini's JSON-schema parameters working:

- every property has a ``type``: one JSON type, or a pair ``[type, "null"]``;
- no ``oneOf``, ``anyOf``, ``allOf``, ``not``, ``$ref`` or ``$defs`` anywhere;
- every object has ``additionalProperties: false`` and a ``required`` that lists every property;
- every array has ``items``;
- every parameter has a description; a ``default`` (valid against its own schema) unless the call
  must send it; numbers and whole numbers their bounds (``minimum`` or ``exclusiveMinimum``, ``maximum``).

Not checked: annotation keywords a provider may not take (OpenAI's strict mode does not list ``default``
among its keywords: a strict client drops it; each description repeats the default in words).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import io
import json

import httpx
import jsonschema
import pytest
from PIL import Image
from support.app import start_app

from neuron_backend.errors import InvalidRequestError
from neuron_backend.runtime import Backend
from tools.mcp.tools import file_arguments, mcp_tools

AUTH = ("ada", "lovelace")

JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}
UNIONS = ("oneOf", "anyOf", "allOf", "not", "$ref", "$defs")
NEEDED = {"message", "prompt", "references"}  # what each tool cannot do without (edit_image: prompt, references)


def strict_problems(schema: dict, where: str = "schema") -> list[str]:
    """What keeps ``schema`` (and every schema inside it) out of the strict subset (see the module's docstring)."""
    problems = [f"{where}: {word}" for word in UNIONS if word in schema]
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is None or not set(kinds) <= JSON_TYPES or (isinstance(kind, list) and (len(kind) != 2
                                                                                     or "null" not in kind)):
        problems.append(f"{where}: type {kind!r}")
    if "object" in kinds:
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            problems.append(f"{where}: additionalProperties is not false")
        if sorted(schema.get("required", [])) != sorted(properties):
            problems.append(f"{where}: required {schema.get('required')} is not every property")
        for name, sub in properties.items():
            problems += strict_problems(sub, f"{where}.{name}")
    if "array" in kinds:
        problems += strict_problems(schema["items"], f"{where}[]") if "items" in schema else [f"{where}: no items"]
    return problems


def parameter_problems(schema: dict) -> list[str]:
    """Parameters without a description, a default or (numbers) their bounds; defaults their schema refuses."""
    problems = []
    for name, sub in schema["properties"].items():
        kinds = sub["type"] if isinstance(sub["type"], list) else [sub["type"]]
        if not sub.get("description"):
            problems.append(f"{name}: no description")
        if name not in NEEDED:
            if "default" not in sub:
                problems.append(f"{name}: no default")
            else:
                try:
                    jsonschema.validate(sub["default"], sub)
                except jsonschema.ValidationError:
                    problems.append(f"{name}: its default {sub['default']!r} is not valid against its schema")
        if {"integer", "number"} & set(kinds) and not (
                ("minimum" in sub or "exclusiveMinimum" in sub) and "maximum" in sub):
            problems.append(f"{name}: no minimum or maximum")
    return problems


def test_every_tool_schema_keeps_to_the_strict_subset(tiny_settings):
    tools = mcp_tools(Backend(tiny_settings))
    assert {tool.name for tool in tools.values()} == {"chat", "generate_image", "warmup_status"}
    for tool in tools.values():
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        jsonschema.Draft202012Validator.check_schema(tool.output)
        assert strict_problems(tool.input_schema) == [], tool.name
        assert parameter_problems(tool.input_schema) == [], tool.name
    chat = tools["chat"].input_schema["properties"]
    assert chat["max_new_tokens"]["maximum"] == tiny_settings.max_new_tokens
    assert chat["seed"]["type"] == ["integer", "null"] and chat["seed"]["maximum"] == 2**32 - 1
    image = tools["generate_image"].input_schema["properties"]
    assert image["steps"]["maximum"] == tiny_settings.max_steps
    assert image["images"]["maximum"] == tiny_settings.max_images_per_run
    assert image["size"]["enum"] == [size.label for size in tiny_settings.sizes]


def test_edit_image_is_a_tool_only_where_editing_is_declared_and_keeps_to_the_subset(tiny_settings):
    assert "edit_image" not in mcp_tools(Backend(tiny_settings))  # --references 0: no /edit_image, no tool
    tools = mcp_tools(Backend(dataclasses.replace(tiny_settings, references=(0, 1, 2))))
    assert [tool.name for tool in tools.values()] == ["chat", "generate_image", "edit_image", "warmup_status"]
    edit = tools["edit_image"]
    jsonschema.Draft202012Validator.check_schema(edit.input_schema)
    jsonschema.Draft202012Validator.check_schema(edit.output)
    assert strict_problems(edit.input_schema) == [] and parameter_problems(edit.input_schema) == []
    params = edit.input_schema["properties"]
    assert list(params)[:3] == ["prompt", "references", "fit"]
    assert (params["references"]["minItems"], params["references"]["maxItems"]) == (1, 2)
    assert params["references"]["items"]["type"] == "string" and params["fit"]["default"] == "letterbox"
    assert {k: v for k, v in params.items() if k not in ("prompt", "references", "fit")} == {
        k: v for k, v in tools["generate_image"].input_schema["properties"].items() if k != "prompt"}
    assert "1, 2 reference image" in edit.summary
    with pytest.raises(InvalidRequestError, match="needs the argument references"):
        edit.arguments({"prompt": "x"})


def test_base64_references_become_named_files_and_bad_ones_are_refused(tiny_settings):
    edit = mcp_tools(Backend(dataclasses.replace(tiny_settings, references=(0, 1, 2))))["edit_image"]
    png, jpeg = _image_bytes("PNG"), _image_bytes("JPEG")
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    files = file_arguments(edit, {"references": [base64.b64encode(png).decode(), url]})
    assert files == {"references": [("reference-1.png", png), ("reference-2.jpg", jpeg)]}
    assert file_arguments(edit, {"references": [base64.b64encode(b"text").decode()]})["references"][0][0] == \
        "reference-1.bin"  # the endpoint refuses it, naming the formats it reads
    with pytest.raises(InvalidRequestError, match="3 reference images are not served here"):
        file_arguments(edit, {"references": ["AAAA"] * 3})  # counted before anything is decoded
    for bad in ("not base64!", "", 42):
        with pytest.raises(InvalidRequestError, match="item 1 of references is not a file as base64"):
            file_arguments(edit, {"references": [bad]})


def _image_bytes(kind: str, size=(80, 48)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 40, 90)).save(out, kind)
    return out.getvalue()


# ----- the tools served, through the official client ---------------------------------------------
@pytest.fixture(scope="module")
def mcp_app(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcp-tools")
    demo, backend, url = start_app(root, "--mcp")
    yield backend, url, root
    demo.close()


def _session(url: str, calls, transport: str = "http"):
    """Open an MCP session at ``url`` (streamable HTTP or SSE) and run ``calls(session)``."""
    from mcp import ClientSession
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    async def run():
        client = streamable_http_client(url) if transport == "http" else sse_client(url)
        async with client as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                return await calls(session)

    return asyncio.run(asyncio.wait_for(run(), timeout=240))


@pytest.mark.slow
def test_the_documented_urls_serve_the_strict_schemas(mcp_app):
    """``/gradio_api/mcp`` (streamable HTTP; a path that ends in /mcp is what the MCP Inspector CLI reads
    as HTTP) and ``/gradio_api/mcp/sse`` (SSE) list the same tools with the strict schemas."""
    backend, url, _ = mcp_app

    async def listed(session):
        return {tool.name: tool for tool in (await session.list_tools()).tools}

    http = _session(url + "gradio_api/mcp", listed)
    sse = _session(url + "gradio_api/mcp/sse", listed, transport="sse")
    assert set(http) == set(sse) == {"chat", "generate_image", "warmup_status"}
    for name, tool in http.items():
        assert strict_problems(tool.inputSchema) == [], name
        assert parameter_problems(tool.inputSchema) == [], name
        assert tool.outputSchema is not None and tool.outputSchema["type"] == "object"
        assert sse[name].inputSchema == tool.inputSchema
    assert "images" in http["generate_image"].outputSchema["properties"]
    served = httpx.get(url + "gradio_api/mcp/schema").json()  # Gradio's schema route shows the same
    assert {t["name"]: t["inputSchema"] for t in served if t["meta"]["mcp_type"] == "tool"} == {
        name: t.inputSchema for name, t in http.items()}


@pytest.mark.slow
def test_every_tool_called_with_numbers_returns_json_and_one_image_block_per_image(mcp_app):
    backend, url, root = mcp_app
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    numbers = {"message": "Hello", "history": history, "system_prompt": "Be brief.", "temperature": 0.5,
               "top_p": 0.9, "top_k": 10, "max_new_tokens": 4, "seed": 11}
    as_text = {**numbers, "temperature": "0.5", "top_p": "0.9", "top_k": "10", "max_new_tokens": "4",
               "seed": "11", "greedy": "false"}  # the form some clients send numbers in (older Inspector CLIs)

    progress = []

    async def on_progress(step, total, message):
        progress.append(message)

    async def calls(session):
        return (await session.call_tool("chat", numbers), await session.call_tool("chat", as_text),
                await session.call_tool("generate_image", {"prompt": "a lighthouse", "size": "96x64", "steps": 1,
                                                           "seed": 7, "images": 2, "guidance": None}),
                await session.call_tool("warmup_status", {}),
                await session.call_tool("generate_image", {"prompt": "a lighthouse", "steps": 1, "seed": 3},
                                        progress_callback=on_progress))  # Gradio's path with progress updates

    chat, chat_text, image, status, followed = _session(url + "gradio_api/mcp", calls)
    for result in (chat, chat_text, image, status, followed):
        assert not result.isError, result.content[0].text
        assert result.content[0].type == "text" and json.loads(result.content[0].text) == result.structuredContent
    reply = chat.structuredContent
    assert reply["done"] is True and isinstance(reply["answer"], str) and "delta" not in reply
    assert reply["stats"]["seed"] == 11 and reply["stats"]["max_new_tokens"] == 4
    assert 1 <= reply["stats"]["new_tokens"] <= 4
    assert chat_text.structuredContent["answer"] == reply["answer"]  # same seed, same settings, same reply

    blocks = [c for c in image.content if c.type == "image"]
    params = image.structuredContent["images"]
    assert len(blocks) == len(params) == 2
    assert [p["seed"] for p in params] == [7, 8] and all(p["size"] == "96x64" for p in params)
    for block, param in zip(blocks, params, strict=True):
        png = Image.open(io.BytesIO(base64.b64decode(block.data)))
        assert block.mimeType == "image/png" and png.format == "PNG" and png.size == (96, 64)
        assert json.loads(png.text["showcase"])["seed"] == param["seed"]  # the PNG as written, parameters in it
    texts = " ".join(c.text for c in image.content if c.type == "text")
    assert str(root) not in texts and "/tmp" not in texts and "gradio_api/file" not in texts  # no server path
    assert progress and [c.type for c in followed.content] == ["text", "image"]
    assert followed.structuredContent["images"][0]["seed"] == 3
    assert status.structuredContent["ready"] is True and status.structuredContent["compiles_since_ready"] == 0
    assert str(root) not in status.content[0].text  # no login: no server folder


@pytest.mark.slow
def test_bad_arguments_get_a_message_that_says_what_is_allowed(mcp_app):
    backend, url, _ = mcp_app
    refused = {
        "chat": [({"message": "Hi", "max_new_tokens": 900}, ["max_new_tokens", "1 to 200"]),
                 ({"message": "Hi", "temperature": "warm"}, ["temperature", "0.01 to 2"]),
                 ({"message": "Hi", "colour": "red"}, ["colour", "message, history", "max_new_tokens, greedy, seed"]),
                 ({}, ["message"])],
        "generate_image": [({"prompt": "x", "images": 9}, ["1 to 4"]),
                           ({"prompt": "x", "steps": 1, "size": "512x512"}, ["64x64, 96x64"])],
        "warmup_status": [({"verbose": True}, ["verbose"])],
        "draw": [({}, ["chat, generate_image, warmup_status"])],
    }

    async def calls(session):
        results = [(name, args, words, await session.call_tool(name, args))
                   for name, cases in refused.items() for args, words in cases]
        return results, await session.call_tool("chat", {"message": "Still there?", "max_new_tokens": 2})

    results, after = _session(url + "gradio_api/mcp", calls)
    for name, args, words, result in results:
        text = result.content[0].text
        assert result.isError, (name, args)
        assert all(word in text for word in words), (name, args, text)
        for python in ("Traceback", "Input validation error", "NoneType", "not valid under any", "view API", "/tmp"):
            assert python not in text, (name, args, text)
    assert not after.isError and after.structuredContent["done"] is True  # the app keeps working


# ----- edit_image, served where editing is declared ----------------------------------------------
@pytest.fixture(scope="module")
def mcp_edit_app(tmp_path_factory):
    demo, backend, url = start_app(tmp_path_factory.mktemp("mcp-edit"), "--mcp", "--references", "0,1,2")
    yield backend, url
    demo.close()


def _over_limit_png() -> bytes:
    """A few KB of PNG declaring 2049x2048 pixels: over the 4 MP reference limit of sizes this small."""
    buffer = io.BytesIO()
    Image.new("1", (2049, 2048)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.slow
def test_edit_image_takes_base64_references_and_records_them(mcp_edit_app):
    backend, url = mcp_edit_app
    png, jpeg = _image_bytes("PNG", (150, 90)), _image_bytes("JPEG", (70, 110))
    refs = [base64.b64encode(png).decode(), "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()]
    refused = [({"prompt": "x", "references": refs * 2}, "Allowed counts: 1, 2."),
               ({"prompt": "x", "references": refs[:1], "fit": "stretch"}, "use letterbox, crop"),
               ({"prompt": "x", "references": ["%%%"]}, "not a file as base64"),
               ({"prompt": "x", "references": [base64.b64encode(b"plain text").decode()]}, "send PNG, JPEG, WEBP"),
               ({"prompt": "x", "references": [base64.b64encode(_over_limit_png()).decode()]},
                "is 2049x2048 pixels; this server takes references of at most 4194304 pixels (4.0 megapixels)"),
               ({"prompt": "x"}, "needs the argument references")]

    async def calls(session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        edited = await session.call_tool("edit_image", {"prompt": "make it night", "references": refs,
                                                        "fit": "letterbox,crop", "size": "96x64", "steps": 1,
                                                        "seed": 7, "images": 2})
        return tools, edited, [(await session.call_tool("edit_image", args), words) for args, words in refused]

    tools, edited, refusals = _session(url + "gradio_api/mcp", calls)
    assert set(tools) == {"chat", "generate_image", "edit_image", "warmup_status"}
    assert strict_problems(tools["edit_image"].inputSchema) == []
    assert not edited.isError, edited.content[0].text
    assert json.loads(edited.content[0].text) == edited.structuredContent
    params = edited.structuredContent["images"]
    blocks = [c for c in edited.content if c.type == "image"]
    assert len(blocks) == len(params) == 2 and [p["seed"] for p in params] == [7, 8]
    assert params[0]["references"] == [
        {"sha256": hashlib.sha256(png).hexdigest(), "original_size": "150x90", "fitted_size": "96x64",
         "fit": "letterbox", "name": "reference-1.png"},
        {"sha256": hashlib.sha256(jpeg).hexdigest(), "original_size": "70x110", "fitted_size": "96x64",
         "fit": "crop", "name": "reference-2.jpg"}]
    for block, param in zip(blocks, params, strict=True):
        image = Image.open(io.BytesIO(base64.b64decode(block.data)))
        assert image.size == (96, 64) and json.loads(image.text["showcase"])["references"] == param["references"]
    assert "/tmp" not in edited.content[0].text and "mcp-files-" not in edited.content[0].text
    for result, words in refusals:
        assert result.isError and words in result.content[0].text, (words, result.content[0].text)
        assert "Traceback" not in result.content[0].text and "/tmp" not in result.content[0].text


# ----- with --auth, through the streamable HTTP transport ----------------------------------------
@pytest.fixture(scope="module")
def mcp_auth_app(tmp_path_factory):
    demo, backend, url = start_app(tmp_path_factory.mktemp("mcp-auth"), "--mcp", "--auth", ":".join(AUTH))
    yield backend, url
    demo.close()


def _mcp_session(url: str, http: httpx.AsyncClient, calls):
    """Open an MCP session on the streamable HTTP endpoint and run ``calls(session)``."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def run():
        async with streamable_http_client(url + "gradio_api/mcp/", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await calls(session)

    return asyncio.run(asyncio.wait_for(run(), timeout=240))


@pytest.mark.slow
def test_mcp_lists_and_calls_every_tool(mcp_auth_app):
    backend, url = mcp_auth_app

    async def calls(session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        status = await session.call_tool("warmup_status", {})
        image = await session.call_tool("generate_image", {"prompt": "a lighthouse", "size": "96x64", "steps": 1,
                                                           "seed": 5})
        chat = await session.call_tool("chat", {"message": "Hello", "max_new_tokens": 6, "greedy": True})
        wrong = await session.call_tool("generate_image", {"prompt": "x", "size": "512x512"})
        return tools, status, image, chat, wrong

    http = httpx.AsyncClient(auth=httpx.BasicAuth(*AUTH), timeout=120)
    tools, status, image, chat, wrong = _mcp_session(url, http, calls)
    assert set(tools) == {"chat", "generate_image", "warmup_status"}
    described = tools["generate_image"]
    assert "64x64, 96x64" in described.description  # the allowed sizes, from the settings
    assert described.inputSchema["properties"]["size"]["enum"] == ["64x64", "96x64"]
    assert f"1 to {backend.settings.max_steps}" in described.inputSchema["properties"]["steps"]["description"]
    assert "200" in tools["chat"].inputSchema["properties"]["max_new_tokens"]["description"]  # --max-new-tokens

    assert not status.isError and json.loads(status.content[0].text)["ready"] is True
    assert not image.isError
    png = next(c for c in image.content if c.type == "image")
    assert png.mimeType == "image/png"
    assert Image.open(io.BytesIO(base64.b64decode(png.data))).size == (96, 64)
    assert any(json.loads(c.text)["images"][0]["seed"] == 5 for c in image.content if c.type == "text")
    assert not chat.isError and json.loads(chat.content[0].text)["done"] is True
    assert wrong.isError and "64x64" in wrong.content[0].text and "96x64" in wrong.content[0].text  # allowed sizes


def test_auth_protects_mcp_and_metrics_but_not_probes(mcp_auth_app):
    _, url = mcp_auth_app
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}}
    headers = {"accept": "application/json, text/event-stream"}
    for kwargs in ({}, {"auth": ("ada", "wrong")}):
        refused = httpx.post(url + "gradio_api/mcp/", json=init, headers=headers, **kwargs)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
        assert httpx.get(url + "metrics", **kwargs).status_code == 401
        assert httpx.get(url + "gradio_api/mcp/schema", **kwargs).status_code == 401
    assert httpx.post(url + "gradio_api/mcp/", json=init, headers=headers, auth=AUTH).status_code == 200
    assert httpx.get(url + "healthz").status_code == 200
    assert httpx.get(url + "readyz").status_code == 200
    with httpx.Client() as browser_like:  # Gradio's login cookie works as well as HTTP Basic
        assert browser_like.post(url + "login", data={"username": AUTH[0], "password": AUTH[1]}).status_code == 200
        assert browser_like.get(url + "metrics").status_code == 200


@pytest.mark.slow
def test_mcp_off_by_default(tmp_path):
    demo, _, url = start_app(tmp_path, warm=False)
    try:
        assert httpx.get(url + "gradio_api/mcp/schema").status_code == 404
    finally:
        demo.close()
