"""A reply's ChatStats for tests of what the page says about it."""

from __future__ import annotations

from neuron_backend.chat.text import ChatStats


def chat_stats(**changes) -> ChatStats:
    """A finished 40-token reply's stats, with ``changes`` applied."""
    values = dict(prompt_tokens=12, bucket=64, new_tokens=40, time_to_first_token_s=0.123, tokens_per_s=35.06,
                  total_s=1.3, compiled_graphs=0, dropped_turns=0, context_length=256, max_new_tokens=40,
                  stopped=False, finish_reason="eos", seed=7)
    return ChatStats(**{**values, **changes})
