"""Many chat users as a plug-in: ``--chat-batch N`` (1 to 16). Above 1 its ``chat_batch`` part makes every compiled
chat shape N rows and hands the chat engine a ``batch.BatchRunner``; at 1 it adds nothing and the engine serves one
reply at a time, without importing ``batch.py``."""

from __future__ import annotations

from neuron_backend.errors import ConfigError
from neuron_backend.plugins import ChatBatch, Parts
from neuron_backend.settings import Settings, add_flag, as_int
from tools.parallel.plugin import choice as tensor_parallel

MAX_ROWS = 16


def add_flags(parser) -> None:
    add_flag(parser.add_argument_group("many chat users (tools/chat_batch)"), "chat-batch", "int",
             "chat replies generated together in one fixed batch of N slots (1: one at a time)")


def rows(settings: Settings) -> int:
    """--chat-batch, checked: 1 to 16, and 1 where --tp shards the chat (its followers mirror only single replies)."""
    n = as_int("chat-batch", settings.options.get("chat_batch", 1))
    if not 1 <= n <= MAX_ROWS:
        raise ConfigError("--chat-batch", f"{n} is out of range", f"1 to {MAX_ROWS}")
    if n > 1 and (tp := tensor_parallel(settings)).tp > 1 and tp.engine == "chat":
        raise ConfigError("--chat-batch", f"batching {n} replies is not supported with --tp {tp.tp} yet",
                          "--chat-batch 1 with --tp, --tp 1 with --chat-batch, or --tp-engine image")
    return n


def runner(engine):
    """``ChatBatch.runner``: the loaded chat engine's batch runner (imports torch and transformers)."""
    from .batch import BatchRunner

    return BatchRunner(engine)


def plug(settings: Settings) -> Parts:
    n = rows(settings)
    return Parts(chat_batch=ChatBatch(n, runner)) if n > 1 else Parts()
