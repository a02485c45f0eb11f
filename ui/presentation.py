"""Text the UI shows, built from plain data (no Gradio here, so it is testable on its own).

Everything user- or model-written that ends up in HTML goes through ``html.escape``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

# Code the Markdown renderer shows verbatim: fenced blocks and inline code spans (escapes stay out of them).
_CODE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?(?:\n {0,3}\1[`~]*[ \t]*(?=\n|\Z)|\Z)|(`+)(?!`).+?(?<!`)\2(?!`)",
                   re.M | re.S)
_ESCAPABLE = re.compile(r"(\\*)([<&])")


def chat_stats_text(stats) -> str:
    """'0.12 s to first token · 35.1 tokens/s · 40 new tokens · seed 7 · no compile' (ChatStats or its dict)."""
    if not stats:
        return ""
    get = stats.get if isinstance(stats, dict) else lambda key, default=None: getattr(stats, key, default)
    first = get("time_to_first_token_s")
    compiled = "⚠ compiled a graph" if get("compiled_graphs") else "no compile"
    seed = f" · seed {get('seed')}" if get("seed") is not None else ""
    stopped = " · stopped" if get("stopped") else ""
    limit = f" · cut at the {get('max_new_tokens')}-token limit" if get("finish_reason") == "length" else ""
    return (f"{'?' if first is None else f'{first:.2f}'} s to first token · {get('tokens_per_s') or 0:.1f} tokens/s · "
            f"{get('new_tokens')} new tokens{seed} · {compiled}{stopped}{limit}")


def context_meter_text(stats, buckets: tuple[int, ...], context_length: int) -> str:
    """Tokens used against the bucket and cache limits, and dropped turns."""
    if stats is None:
        return f"Context: prompt buckets {', '.join(map(str, buckets))} tokens · cache {context_length} tokens"
    used = stats.prompt_tokens + stats.new_tokens
    text = (f"Context: prompt {stats.prompt_tokens}/{stats.bucket} tokens (bucket) · "
            f"{used}/{context_length} tokens of cache")
    if stats.dropped_turns:
        text += f" · ⚠ {stats.dropped_turns} oldest turn(s) dropped to fit the {buckets[-1]}-token limit"
    return text


def conversation_markdown(document: dict) -> str:
    """An exported conversation (``chat.history.export_document``) as Markdown that reads as a
    conversation: who said what, each reply's reasoning as a quote, its notices and stats under it."""
    settings = document.get("settings") or {}
    shown = ", ".join(f"{k} {v}" for k, v in settings.items() if v is not None)
    lines = [f"# Conversation with {document.get('model') or 'the chat model'}", "",
             f"Exported {document.get('exported_at') or datetime.now(timezone.utc).isoformat(timespec='seconds')}"
             + (f" · {shown}" if shown else ""), ""]
    if document.get("system_prompt"):
        lines += ["**System prompt:**", "", *_quoted(document["system_prompt"]), ""]
    for m in document.get("messages") or []:
        lines += [f"## {'You' if m.get('role') == 'user' else 'Assistant'}", ""]
        if m.get("reasoning"):
            lines += ["> 💭 **Reasoning**", ">", *_quoted(m["reasoning"]), ""]
        lines += [m.get("content") or "*(no answer)*", ""]
        lines += [f"> ⚠ {notice}" for notice in m.get("notices") or []]
        if m.get("stats"):
            lines += [f"*{chat_stats_text(m['stats'])}*"]
        if m.get("notices") or m.get("stats"):
            lines.append("")
    return "\n".join(lines)


def _quoted(text: str) -> list[str]:
    return [f"> {line}" if line else ">" for line in text.splitlines()]


def _outside_code(text: str, change) -> str:
    """Apply ``change`` to the parts of ``text`` that are not code spans or fenced code blocks."""
    out, at = [], 0
    for match in _CODE.finditer(text):
        out += [change(text[at:match.start()]), match.group(0)]
        at = match.end()
    out.append(change(text[at:]))
    return "".join(out)


def markdown_literal(text: str) -> str:
    """Chat text as Markdown that shows exactly what was typed: no live HTML, no lost angle brackets.

    Every ``<`` and ``&`` outside code gets a backslash (backslashes already in front of one are
    doubled), so the page's Markdown renderer shows ``List<String>`` and ``<div style=...>`` as text
    instead of parsing a tag (which its sanitizer then deletes or keeps live). Code spans and fenced
    blocks are shown verbatim by the renderer and are left alone. ``markdown_unliteral`` undoes it.
    """
    return _outside_code(text, lambda part: _ESCAPABLE.sub(lambda m: m.group(1) * 2 + "\\" + m.group(2), part))


def markdown_unliteral(text: str) -> str:
    """The text ``markdown_literal`` was given (for history coming back from the page)."""
    return _outside_code(text, lambda part: _ESCAPABLE.sub(lambda m: m.group(1)[: len(m.group(1)) // 2] + m.group(2),
                                                           part))


def python_snippet(url: str, params: dict, images: int = 1) -> str:
    """The gradio_client call that reproduces an image, or with ``images`` > 1 a run from seed ``params["seed"]``
    (then the PNGs and the parameters come back as lists)."""
    return (
        "from gradio_client import Client\n\n"
        f"client = Client({url!r})\n"
        f"{'png_paths, params_list' if images > 1 else 'png_path, params'} = client.predict(\n"
        f"    prompt={params['prompt']!r},\n"
        f"    size={params['size']!r},\n"
        f"    steps={params['steps']!r},\n"
        f"    seed={params['seed']!r},\n"
        f"    guidance={params.get('guidance')!r},\n"
        + (f"    images={images!r},  # seeds {params['seed']}, {params['seed']} + 1, ...\n" if images > 1 else "")
        + '    api_name="/generate_image",\n'
        ")\n"
    )
