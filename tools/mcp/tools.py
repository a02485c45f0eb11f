"""``--mcp``: the public endpoints as MCP tools: names, descriptions, input and output schemas, argument checks.

Three endpoints become tools, four where editing is declared, described from the settings when the page
is made (allowed sizes, step and token limits, reference counts, what comes back):

- ``chat``            /chat: one reply (the tool returns the last update of the stream)
- ``generate_image``  /generate_image: one MCP image block per PNG and their parameters
- ``edit_image``      /edit_image (only with a ``--references`` count above 0): as generate_image, from
                      reference images sent as base64 strings (MCP has no file upload); ``file_arguments``
                      decodes them, and the server hands them to the endpoint as uploaded files
- ``warmup_status``   /status: what is ready, what is still compiling, the recompile alarm

Gradio 6.31 builds a tool's input schema from the endpoint's type hints and API components (an
optional value becomes ``oneOf: [{"type": "null"}, X]``), keeps limits in prose, lists no output
schema and returns every result as Python's ``str()`` of it; it has no hook to change either. So the
schemas are written here and ``tools/mcp/server.py`` serves them in place of Gradio's. The input schemas
keep to what strict function calling accepts:

- every property has a ``type``: one JSON type, or ``[type, "null"]`` where null means "the default"
  (seed, temperature, top_p, guidance: their default is not one value); no oneOf/anyOf/allOf/$ref;
- ``additionalProperties: false`` and ``required`` lists every property, on the tool's object and on
  each history item (OpenAI's strict mode); a call may still leave any out but ``message``/``prompt``;
- limits as ``minimum``/``maximum``/``exclusiveMinimum``/``enum``/``maxItems``, the default as ``default``,
  and a description on every property (which repeats the limits and the default in words).

Results are JSON: ``structuredContent`` (checked against the tool's ``outputSchema`` by clients) and
the same JSON as the first text block; ``generate_image`` and ``edit_image`` add one image block per PNG. Nothing in a
result names a server path.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from neuron_backend.chat.text import MAX_TOP_K, MIN_TEMPERATURE, SAMPLING_DEFAULTS
from neuron_backend.errors import InvalidRequestError
from neuron_backend.image.inputs import GUIDANCE_MAX, GUIDANCE_MIN
from neuron_backend.image.references import DEFAULT_FIT, FIT_MODES, READ_FORMATS, check_reference_count
from neuron_backend.messages import tr
from neuron_backend.runtime import Backend
from ui.api import SEED_MAX

_WHOLE = re.compile(r"[+-]?\d{1,20}")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_DATA_URL = re.compile(r"data:[\w.+/-]*(;[\w=.-]+)*;base64,", re.IGNORECASE)
IMAGE_ENDPOINTS = ("generate_image", "edit_image")  # the endpoints whose outputs are PNGs and their parameters
# A file's first bytes -> the extension its upload is named with (the endpoint reads the format from the bytes).
_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", ".png"), (b"\xff\xd8\xff", ".jpg"), (b"RIFF", ".webp"))


@dataclass(frozen=True)
class Tool:
    """One MCP tool: the endpoint it calls, what an agent reads about it, and what it returns."""

    name: str
    api_name: str  # the Gradio endpoint
    summary: str
    params: dict[str, dict] = field(default_factory=dict)  # name -> the parameter's JSON schema
    needed: tuple[str, ...] = ()  # what a call must send (every other parameter has a default)
    output: dict = field(default_factory=dict)  # the JSON schema of structuredContent
    files: dict[str, tuple[int, ...]] = field(default_factory=dict)  # parameter -> the counts of base64 files
    # it may hold (the endpoint takes them as uploaded files)

    @property
    def input_schema(self) -> dict:
        return {"type": "object", "properties": self.params, "required": list(self.params),
                "additionalProperties": False}

    @property
    def docstring(self) -> str:
        """The summary and one "name: description" line per parameter (the form Gradio's API page parses)."""
        lines = "".join(f"    {name}: {schema['description']}\n" for name, schema in self.params.items())
        return self.summary + ("\n\nArgs:\n" + lines if lines else "")

    def arguments(self, given: dict[str, Any] | None) -> dict[str, Any]:
        """Every parameter's value for the endpoint: the given ones, defaults for the rest.

        Numbers and true/false written as text (as some MCP clients send them) are read as such; a value
        of the wrong type otherwise goes on as it is, and the endpoint's own checks refuse it with a
        message that says what is allowed.
        """
        given = given or {}
        unknown = sorted(set(given) - set(self.params))
        if unknown and not self.params:
            raise InvalidRequestError(tr("{tool} takes no arguments; got {names}.", tool=self.name,
                                         names=", ".join(unknown)))
        if unknown:
            raise InvalidRequestError(tr("{tool} takes no argument {names}; it takes: {allowed}.", tool=self.name,
                                         names=", ".join(unknown), allowed=", ".join(self.params)))
        values = {}
        for name, schema in self.params.items():
            value = _read(schema, given.get(name))
            if value is None and "null" not in _types(schema):
                if name in self.needed:
                    raise InvalidRequestError(tr("{tool} needs the argument {name}: {what}", tool=self.name,
                                                 name=name, what=schema["description"]))
                value = schema.get("default")
            values[name] = value
        return values


def _types(schema: dict) -> list[str]:
    kind = schema["type"]
    return list(kind) if isinstance(kind, list) else [kind]


def _read(schema: dict, value: Any) -> Any:
    """``value`` with a number or true/false written as text read as one, where the schema asks for it."""
    if not isinstance(value, str):
        return value
    text, types = value.strip(), _types(schema)
    if "string" in types:
        return value
    if text in ("", "null") and "null" in types:
        return None
    if "boolean" in types and text in ("true", "false"):
        return text == "true"
    if "integer" in types and _WHOLE.fullmatch(text):
        return int(text)
    if "number" in types and _NUMBER.fullmatch(text) and math.isfinite(float(text)):
        return float(text)
    return value


def _nullable(kind: str) -> list[str]:
    return [kind, "null"]


def _seed(what: str) -> dict:
    return {"type": _nullable("integer"), "minimum": 0, "maximum": SEED_MAX, "default": None,
            "description": f"a whole number from 0 to {SEED_MAX} for a reproducible {what}; null (the default) "
                           "for a random one."}


def chat_tool(backend: Backend) -> Tool:
    s = backend.settings
    think, plain = SAMPLING_DEFAULTS["thinking"], SAMPLING_DEFAULTS["chat"]
    reply = {"type": "object", "properties": {
        "answer": {"type": "string", "description": "the reply text"},
        "reasoning": {"type": "string", "description": "the model's thinking (empty unless thinking is true)"},
        "done": {"type": "boolean"},
        "dropped_turns": {"type": "integer", "description": "old turns left out to fit the context"},
        "stats": {"type": _nullable("object"), "description": "prompt_tokens, bucket, new_tokens, "
                  "time_to_first_token_s, tokens_per_s, seed, finish_reason, ..."},
        "notices": {"type": "array", "items": {"type": "string"},
                    "description": "e.g. stopped at the token limit before the reply was finished"}},
        "required": ["answer", "reasoning", "done", "dropped_turns", "stats", "notices"]}
    turn = {"type": "object", "additionalProperties": False, "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"], "description": "who wrote the turn"},
        "content": {"type": "string", "description": "the turn's text"}}}
    return Tool("chat", "chat", (
        f"Chat with {backend.model_id('chat')}: send one user message, get the assistant's reply. "
        "The result is one JSON object: answer (the reply text), reasoning (the model's thinking, empty "
        "unless thinking is true), done, dropped_turns (old turns left out to fit the context), stats "
        "(prompt_tokens, bucket, new_tokens, time_to_first_token_s, tokens_per_s, seed, ...) and notices. The "
        "server keeps no memory between calls: pass earlier turns in history. While the chat engine is still "
        "warming up the call is refused with a message that says when to retry (warmup_status tells)."), {
        "message": {"type": "string", "description": f"the user's message (at most {s.max_prompt_chars} "
                                                     "characters)."},
        "history": {"type": "array", "items": turn, "maxItems": s.max_history_messages, "default": [],
                    "description": "earlier turns, oldest first, as objects {\"role\": \"user\" or \"assistant\", "
                                   "\"content\": text}; empty (the default) for a new chat. The oldest turns are "
                                   f"dropped when the prompt exceeds {s.buckets[-1]} tokens."},
        "system_prompt": {"type": "string", "default": "",
                          "description": "a system prompt; empty (the default) for none."},
        "thinking": {"type": "boolean", "default": False,
                     "description": "true to let the model reason before answering (Qwen3 thinking mode; slower); "
                                    "default false."},
        "temperature": {"type": _nullable("number"), "minimum": MIN_TEMPERATURE, "maximum": 2.0, "default": None,
                        "description": f"sampling temperature, {MIN_TEMPERATURE:g} to 2; null (the default) for "
                                       f"{think['temperature']:g} with thinking, else {plain['temperature']:g}."},
        "top_p": {"type": _nullable("number"), "exclusiveMinimum": 0, "maximum": 1.0, "default": None,
                  "description": f"nucleus sampling, above 0 and at most 1; null (the default) for "
                                 f"{think['top_p']:g} with thinking, else {plain['top_p']:g}."},
        "top_k": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_K, "default": plain["top_k"],
                  "description": f"top-k sampling, 0 (off) to {MAX_TOP_K}; default {plain['top_k']}."},
        "max_new_tokens": {"type": "integer", "minimum": 1, "maximum": s.max_new_tokens,
                           "default": s.max_new_tokens,
                           "description": f"most tokens in the reply, 1 to {s.max_new_tokens} (default "
                                          f"{s.max_new_tokens})."},
        "greedy": {"type": "boolean", "default": False,
                   "description": "true for deterministic greedy decoding (temperature, top_p and top_k are then "
                                  "ignored); default false."},
        "seed": _seed("reply")}, needed=("message",), output=reply)


def _image_result(reference_entries: bool = False) -> dict:
    """The JSON schema of an image tool's structuredContent: one parameters object per image."""
    properties = {
        "prompt": {"type": "string"}, "seed": {"type": "integer"}, "steps": {"type": "integer"},
        "size": {"type": "string"}, "width": {"type": "integer"}, "height": {"type": "integer"},
        "guidance": {"type": _nullable("number")}, "seconds": {"type": "number"}}
    if reference_entries:
        properties["references"] = {"type": "array", "items": {"type": "object"},
                                    "description": "each reference's sha256, original_size, fitted_size, fit, name"}
    image = {"type": "object", "description": "the parameters of one image, as its PNG embeds them",
             "properties": properties, "required": ["prompt", "seed", "steps", "size", "width", "height"]}
    return {"type": "object", "required": ["images"], "properties": {
        "images": {"type": "array", "items": image,
                   "description": "one entry per image, in the order of the image blocks"}}}


def _image_params(backend: Backend, what: str) -> dict[str, dict]:
    """generate_image's parameters (edit_image's too, beside its references); ``what``: the prompt's description."""
    s = backend.settings
    sizes = [size.label for size in s.sizes]
    return {
        "prompt": {"type": "string", "description": f"{what} (at most {s.max_prompt_chars} characters)."},
        "size": {"type": "string", "enum": sizes, "default": sizes[0],
                 "description": f"one of {', '.join(sizes)} (default {sizes[0]})."},
        "steps": {"type": "integer", "minimum": 1, "maximum": s.max_steps, "default": s.default_steps,
                  "description": f"denoising steps, 1 to {s.max_steps} (default {s.default_steps})."},
        "seed": _seed("image (the seed used is in the returned parameters; several images take seed, seed+1, "
                      "...)"),
        "guidance": {"type": _nullable("number"), "minimum": GUIDANCE_MIN, "maximum": GUIDANCE_MAX,
                     "default": None,
                     "description": f"guidance scale, {GUIDANCE_MIN:g} to {GUIDANCE_MAX:g}; null (the default) for "
                                    "the model's own (a distilled model such as FLUX.2-klein ignores it)."},
        "images": {"type": "integer", "minimum": 1, "maximum": s.max_images_per_run, "default": 1,
                   "description": f"how many images to make, one after another, 1 to {s.max_images_per_run} "
                                  "(default 1)."},
        "preview": {"type": "boolean", "default": False,
                    "description": "true to compute live preview frames while the image denoises; an MCP "
                                   "result holds only the finished images, so false (the default) here."}}


def image_tool(backend: Backend) -> Tool:
    sizes = [size.label for size in backend.settings.sizes]
    return Tool("generate_image", "generate_image", (
        f"Generate images from a text prompt with {backend.model_id('image')} (one by default). Only these "
        f"precompiled sizes exist on this server: {', '.join(sizes)} (width x height); any other size is "
        "refused. The result is one PNG image block per image and a JSON object {\"images\": [...]} with each "
        "image's parameters (prompt, size, steps, seed, guidance, seconds) in the same order; each PNG embeds "
        "its parameters. A size still compiling is refused with its expected wait (warmup_status tells)."),
        _image_params(backend, "what to draw"), needed=("prompt",), output=_image_result())


def edit_tool(backend: Backend) -> Tool:
    """edit_image: /edit_image with the reference images as base64 strings (MCP has no file upload)."""
    s = backend.settings
    sizes = [size.label for size in s.sizes]
    counts = tuple(n for n in s.references if n > 0)
    allowed = ", ".join(str(n) for n in counts)
    params = _image_params(backend, "what to change in the reference images, or what to make of them")
    references = {"type": "array", "minItems": counts[0], "maxItems": counts[-1], "items": {
        "type": "string", "description": f"a {', '.join(READ_FORMATS)} file as base64 (a data: URL is read too)"},
        "description": f"the reference images, each a {', '.join(READ_FORMATS)} file as base64 (a data: URL is "
                       f"read too); this server takes {allowed} of them (each count is compiled ahead of time)."}
    fit = {"type": "string", "default": DEFAULT_FIT,
           "description": f"how each reference is fitted to the image size: {' or '.join(FIT_MODES)} (pad or "
                          "centre-crop) for every reference, or one per reference comma-separated "
                          f"(default {DEFAULT_FIT})."}
    return Tool("edit_image", "edit_image", (
        f"Edit images with {backend.model_id('image')}: send reference images (base64) and a prompt that says what "
        f"to change. This server takes {allowed} reference image(s) per call; each is fitted to the image size "
        f"(letterbox pads, crop centre-crops). Only these precompiled sizes exist: {', '.join(sizes)} (width x "
        "height). The result is one PNG image block per image and a JSON object {\"images\": [...]} with each "
        "image's parameters, each reference's sha256, sizes and fit among them (a PNG never holds a reference's "
        "pixels). A size still compiling is refused with its expected wait (warmup_status tells)."),
        {"prompt": params.pop("prompt"), "references": references, "fit": fit, **params},
        needed=("prompt", "references"), output=_image_result(reference_entries=True),
        files={"references": counts})


def status_tool() -> Tool:
    engine = {"type": "object", "description": "state: disabled, loading, ready or failed"}
    result = {"type": "object", "required": ["ready", "progress", "failed", "compiles_since_ready", "engines"],
              "properties": {
                  "ready": {"type": "boolean"}, "progress": {"type": "number"},
                  "eta_s": {"type": _nullable("number")}, "failed": {"type": "array", "items": {"type": "string"}},
                  "compiles_since_ready": {"type": "integer"},
                  "engines": {"type": "object", "additionalProperties": engine},
                  "tasks": {"type": "array", "items": {"type": "object"}}}}
    return Tool("warmup_status", "status", (
        "The server's warm-up status: whether every engine is ready and what is still compiling. "
        "Returns a JSON object with ready (true once every declared shape is compiled), progress (0 to 1), "
        "eta_s (seconds until ready, when known), failed (task names), compiles_since_ready (should stay "
        "0), engines (chat and image: disabled, loading, ready or failed) and per-task details. Call it "
        "when chat or generate_image is refused as still warming up."), output=result)


def mcp_tools(backend: Backend) -> dict[str, Tool]:
    """api_name -> the tool it becomes (edit_image only where ``--references`` declares editing, as /edit_image)."""
    editing = (edit_tool(backend),) if max(backend.settings.references) > 0 else ()
    return {tool.api_name: tool for tool in (chat_tool(backend), image_tool(backend), *editing, status_tool())}


def file_arguments(tool: Tool, values: dict[str, Any]) -> dict[str, list[tuple[str, bytes]]]:
    """Each file parameter's base64 strings decoded: parameter -> [(file name, bytes), ...].

    The count is checked before anything is decoded; the name's extension follows the bytes' signature
    (PNG, JPEG, WebP; ``.bin`` otherwise, which the endpoint refuses with the formats it reads).
    """
    decoded = {}
    for name, counts in tool.files.items():
        items = values.get(name)
        items = [] if items is None else items if isinstance(items, list) else [items]
        check_reference_count(len(items), counts)
        decoded[name] = [_decoded(tool, name, index, item) for index, item in enumerate(items, start=1)]
    return decoded


def _decoded(tool: Tool, name: str, index: int, item: Any) -> tuple[str, bytes]:
    text = item.strip() if isinstance(item, str) else ""
    try:
        data = base64.b64decode(_DATA_URL.sub("", text, count=1), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if not data:
        raise InvalidRequestError(tr("{tool}: item {index} of {name} is not a file as base64; send each image "
                                     "file ({allowed}) as a base64 string.", tool=tool.name, index=index, name=name,
                                     allowed=", ".join(READ_FORMATS)))
    extension = next((ext for signature, ext in _SIGNATURES if data.startswith(signature)), ".bin")
    return f"{name.rstrip('s')}-{index}{extension}", data


def structured(tool: Tool, outputs: list) -> dict:
    """The endpoint's outputs as the tool's JSON result (image files are handed back apart as blocks)."""
    if tool.api_name in IMAGE_ENDPOINTS:
        params = outputs[1] if isinstance(outputs[1], list) else [outputs[1]]
        return {"images": params}
    result = dict(outputs[0])
    result.pop("delta", None)  # a streamed update's increment: the whole reply is in answer
    return result


def image_files(tool: Tool, outputs: list) -> list[dict]:
    """The endpoint's PNG outputs (Gradio's file data: path, url, ...), one per image."""
    if tool.api_name not in IMAGE_ENDPOINTS:
        return []
    return outputs[0] if isinstance(outputs[0], list) else [outputs[0]]


def as_text(result: dict) -> str:
    return json.dumps(result, ensure_ascii=False, default=str)
