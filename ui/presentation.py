"""Text the UI shows, built from plain data (Gradio only through ``ui.i18n``'s table; testable on its own).

Everything user- or model-written that ends up in HTML goes through ``html.escape``.
"""

from __future__ import annotations

import re
from pathlib import Path

from neuron_backend.messages import Message

from .i18n import say

# Code the Markdown renderer shows verbatim: fenced blocks and inline code spans (escapes stay out of them).
_CODE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?(?:\n {0,3}\1[`~]*[ \t]*(?=\n|\Z)|\Z)|(`+)(?!`).+?(?<!`)\2(?!`)",
                   re.M | re.S)
# What makes Markdown text live, each escaped with a backslash outside code: "<" (HTML), "&" (entities),
# "!" before "[" (an image: a remote fetch without a click), and the ":" of "http://" / "https://" / "ftp://"
# and the "." of "www." (GFM's bare-URL autolinks take every character up to a space or "<", an escaping
# backslash included, so a tag right after a URL was live). Each alternative is asserted before the
# backslashes in front of its character, so the same pattern finds them in the escaped text too.
_ESCAPABLE = re.compile(r"(?:(?:(?<=https)|(?<=http)|(?<=ftp))(?=\\*://)|(?<=www)(?=\\*\.)|(?=\\*(?:[<&]|!\[)))"
                        r"(\\*)([<&!:.])", re.IGNORECASE)


def chat_stats_text(stats) -> str:
    """'0.12 s to first token · 35.1 tokens/s · 40 new tokens · seed 7 · no compile' (ChatStats or its dict),
    in the page's language."""
    if not stats:
        return ""
    get = stats.get if isinstance(stats, dict) else lambda key, default=None: getattr(stats, key, default)
    first = get("time_to_first_token_s")
    compiled = say("⚠ compiled a graph" if get("compiled_graphs") else "no compile")
    seed = say(" · seed {seed}", seed=get("seed")) if get("seed") is not None else ""
    stopped = say(" · stopped") if get("stopped") else ""
    limit = say(" · cut at the {limit}-token limit",
                limit=get("max_new_tokens")) if get("finish_reason") == "length" else ""
    line = say("{first} s to first token · {speed} tokens/s · {new} new tokens",
               first="?" if first is None else f"{first:.2f}",
               speed=f"{get('tokens_per_s') or 0:.1f}", new=get("new_tokens"))
    return f"{line}{seed} · {compiled}{stopped}{limit}"


def context_meter_text(stats, buckets: tuple[int, ...], context_length: int) -> str:
    """Tokens used against the bucket and cache limits, and dropped turns (in the page's language)."""
    if stats is None:
        return say("Context: prompt buckets {buckets} tokens · cache {context} tokens",
                   buckets=", ".join(map(str, buckets)), context=context_length)
    used = stats.prompt_tokens + stats.new_tokens
    if not stats.bucket and not stats.prompt_tokens:  # stopped before the server's count (it ends the stream)
        return say("Context: {used} new tokens on the chat server (it counts the prompt when a reply ends)",
                   used=used)
    if not stats.bucket:  # a --chat-server reply: the buckets and the cache are the server's
        return say("Context: prompt {prompt} tokens · {used}/{context} tokens on the chat server",
                   prompt=stats.prompt_tokens, used=used, context=stats.context_length)
    text = say("Context: prompt {prompt}/{bucket} tokens (bucket) · {used}/{context} tokens of cache",
               prompt=stats.prompt_tokens, bucket=stats.bucket, used=used, context=context_length)
    if stats.dropped_turns:
        text += say(" · ⚠ {dropped} oldest turn(s) dropped to fit the {limit}-token limit",
                    dropped=stats.dropped_turns, limit=buckets[-1])
    return text


def _outside_code(text: str, change) -> str:
    """Apply ``change`` to the parts of ``text`` that are not code spans or fenced code blocks."""
    out, at = [], 0
    for match in _CODE.finditer(text):
        out += [change(text[at:match.start()]), match.group(0)]
        at = match.end()
    out.append(change(text[at:]))
    return "".join(out)


def markdown_literal(text: str) -> str:
    """Chat text as Markdown that shows exactly what was typed (``markdown_unliteral`` undoes it): outside code,
    ``<``, ``&``, an image's ``!`` and a bare URL's ``:`` or ``.`` get a backslash, backslashes already in front
    doubled. Why each: docs/page.md, "The Chat tab underneath"."""
    return _outside_code(text, lambda part: _ESCAPABLE.sub(lambda m: m.group(1) * 2 + "\\" + m.group(2), part))


def markdown_unliteral(text: str) -> str:
    """The text ``markdown_literal`` was given (for history coming back from the page)."""
    return _outside_code(text, lambda part: _ESCAPABLE.sub(lambda m: m.group(1)[: len(m.group(1)) // 2] + m.group(2),
                                                           part))


def python_snippet(url: str, params: dict, images: int = 1) -> str:
    """The gradio_client call that reproduces an image, or with ``images`` > 1 a run from seed ``params["seed"]``
    (then the PNGs and the parameters come back as lists). An edit calls /edit_image with its reference
    files named (their sha256 in a comment: the PNG does not carry the images)."""
    references = params.get("references") or []
    files = [r.get("name") or f"reference-{i + 1}.png" for i, r in enumerate(references)]
    fits = [r.get("fit") for r in references]
    edit = "".join(f"        handle_file({name!r}),  # sha256 {r.get('sha256')}\n"
                   for name, r in zip(files, references, strict=True))
    return (
        f"from gradio_client import Client{', handle_file' if references else ''}\n\n"
        f"client = Client({url!r})\n"
        f"{'png_paths, params_list' if images > 1 else 'png_path, params'} = client.predict(\n"
        f"    prompt={params['prompt']!r},\n"
        + (f"    references=[\n{edit}    ],\n"
           f"    fit={fits[0] if len(set(fits)) == 1 else ','.join(fits)!r},\n" if references else "")
        + f"    size={params['size']!r},\n"
        f"    steps={params['steps']!r},\n"
        f"    seed={params['seed']!r},\n"
        f"    guidance={params.get('guidance')!r},\n"
        + (f"    images={images!r},  # seeds {params['seed']}, {params['seed']} + 1, ...\n" if images > 1 else "")
        + f'    api_name="/{"edit_image" if references else "generate_image"}",\n'
        ")\n"
    )


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return say("{n} s", n=f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}")
    if seconds < 3600:
        return say("{m} min {s} s", m=f"{seconds // 60:.0f}", s=f"{seconds % 60:02.0f}")
    return say("{h} h {m} min", h=f"{seconds // 3600:.0f}", m=f"{seconds % 3600 // 60:02.0f}")  # a first compile


def size_choice_label(size, state: dict | None) -> str:
    """'1344x768 (7:4) · ready' for the size picker."""
    state = state or {"state": "queued", "eta_s": None, "error": None}
    key = {"ready": "ready", "failed": "failed",
           "skipped": "unavailable"}.get(state["state"])
    if key is not None:
        text = say(key)
    else:  # only the running task compiles; the others wait their turn
        eta = state.get("eta_s")
        text = say("compiling" if state["state"] == "running" else "queued")
        text = say("{state}, ~{eta}", state=text, eta=fmt_seconds(eta)) if eta else text
    return f"{size.label} ({size.aspect}) · {text}"


# ----- what an anonymous visitor is shown of the server -------------------------------------------------
def server_roots(settings) -> list[tuple[str, str]]:
    """The server's folders an anonymous visitor is not shown, longest first, each with the name shown instead:
    the cache root, the Hugging Face cache, a local model folder, the home folder."""
    from huggingface_hub import constants

    roots = {str(Path.home()): "~", constants.HF_HUB_CACHE: "<hf-cache>", str(settings.cache_dir): "<cache-dir>"}
    for model in (settings.chat_model, settings.image_model):
        if model and Path(model).is_absolute():
            roots[str(model)] = f"<{Path(model).name}>"
    return sorted(roots.items(), key=lambda item: -len(item[0]))


def without_server_paths(value, roots: list[tuple[str, str]]):
    """``value`` (status data: dicts, lists, text, messages) with each server folder in ``roots`` replaced by
    its shown name; a message stays a message (its parameters are replaced), so it still reads in Arabic."""
    if isinstance(value, Message):
        params = {key: without_server_paths(item, roots) for key, item in value.params.items()}
        return Message(value.template, value.ctx, **params)
    if isinstance(value, str):
        for root, shown in roots:
            value = value.replace(root, shown)
        return value
    if isinstance(value, dict):
        return {key: without_server_paths(item, roots) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(without_server_paths(item, roots) for item in value)
    return value


def operator_view(settings) -> bool:
    """Whether the page and /status show server paths and operator actions (cache export): only under
    --auth, where every request comes from a logged-in user."""
    return settings.auth is not None


def visitor_status(backend) -> dict:
    """``Backend.status()`` as this server's visitors may see it: without --auth, no server folder in it."""
    status = backend.status()
    return status if operator_view(backend.settings) else without_server_paths(status, server_roots(backend.settings))
