"""An exported conversation (``document.py``) as Markdown that reads as a conversation, English in either page
language; texts as typed (``ui.presentation.markdown_literal``)."""

from __future__ import annotations

from datetime import datetime, timezone

from ui.i18n import speaking
from ui.presentation import chat_stats_text, markdown_literal


def conversation_markdown(document: dict) -> str:
    """An exported conversation (``document.export_document``) as Markdown that reads as a conversation: who
    said what, each reply's reasoning as a quote, its notices and stats under it; English in either page
    language, texts as typed (``markdown_literal``)."""
    with speaking("en"):
        return _conversation_markdown(document)


def _conversation_markdown(document: dict) -> str:
    settings = document.get("settings") or {}
    shown = ", ".join(f"{k} {_setting(v)}" for k, v in settings.items() if v is not None)
    lines = [f"# Conversation with {document.get('model') or 'the chat model'}", "",
             f"Exported {document.get('exported_at') or datetime.now(timezone.utc).isoformat(timespec='seconds')}"
             + (f" · {shown}" if shown else ""), ""]
    if document.get("system_prompt"):
        lines += ["**System prompt:**", "", *_quoted(markdown_literal(document["system_prompt"])), ""]
    for m in document.get("messages") or []:
        lines += [f"## {'You' if m.get('role') == 'user' else 'Assistant'}", ""]
        if m.get("reasoning"):
            lines += ["> 💭 **Reasoning**", ">", *_quoted(markdown_literal(m["reasoning"])), ""]
        lines += [markdown_literal(m.get("content") or "") or "*(no answer)*", ""]
        lines += [f"> ⚠ {notice}" for notice in m.get("notices") or []]
        if m.get("stats"):
            lines += [f"*{chat_stats_text(m['stats'])}*"]
        if m.get("notices") or m.get("stats"):
            lines.append("")
    return "\n".join(lines)


def _setting(value) -> str:
    """A setting as the export's header line writes it: "on"/"off" for a switch (not Python's True/False)."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _quoted(text: str) -> list[str]:
    return [f"> {line}" if line else ">" for line in text.splitlines()]
