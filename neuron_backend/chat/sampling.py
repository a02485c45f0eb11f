"""The sampling parameters of a chat reply, as ``generate()`` takes them (once per call: batch.py lets rows
share a batch only when theirs are equal)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters generate() takes once per call; rows share a batch only when equal."""

    greedy: bool
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    @classmethod
    def of(cls, request) -> Sampling:
        """From a validated ChatRequest; greedy ignores the others, so all greedy requests are equal."""
        if request.greedy:
            return cls(True)
        return cls(False, request.temperature, request.top_p, request.top_k)

    def generate_kwargs(self) -> dict:
        if self.greedy:  # sampling flags are passed only when sampling: generate() warns about unused ones
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
