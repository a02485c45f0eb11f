"""Test helper: record which KV-cache window an engine's static cache selects."""

from __future__ import annotations


def record_windows(engine, batch: int = 1) -> list[int]:
    """Every window the engine's cache for this batch size selects from now on, in order."""
    seen: list[int] = []
    cache = engine._cache(batch)
    select = cache.select

    def recording(new_tokens: int, prefill: bool = False) -> int:
        seen.append(select(new_tokens, prefill))
        return seen[-1]

    cache.select = recording
    return seen
