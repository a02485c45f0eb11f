"""The remote engines as a plug-in: ``--chat-server URL`` (an OpenAI-compatible server: vLLM Neuron, or this app
with ``--no-image``) and ``--image-server URL[,URL…]`` (image workers: this app with ``--no-chat``)."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from neuron_backend.errors import ConfigError
from neuron_backend.plugins import Elsewhere, Parts
from neuron_backend.settings import Settings, add_flag
from tools.parallel.plugin import shards


@dataclass(frozen=True)
class Servers:
    """Where the engines run, as the flags say."""

    chat: str | None = None  # the OpenAI base URL the chat engine calls instead of a local model
    chat_key: str | None = field(default=None, repr=False)  # the bearer key that server asks for
    images: tuple[str, ...] = ()  # workers' base URLs the image engine calls instead of a local model


def add_flags(parser) -> None:
    group = parser.add_argument_group("engines on other servers (tools/remote)")
    add_flag(group, "chat-server", "str", "chat on an OpenAI-compatible server at this base URL, e.g. "
                                          "http://10.0.0.5:8000/v1")
    add_flag(group, "chat-server-key", "str", "bearer key the --chat-server asks for (its --api-key); default none")
    add_flag(group, "image-server", "str", "images from workers (this app with --no-chat) at these comma-separated "
                                           "base URLs")


def servers(settings: Settings) -> Servers:
    """The servers the flags name, checked against the engines this app runs."""
    given = settings.options
    key = str(given.get("chat_server_key", "")).strip() or None
    found = Servers(chat=_url(given["chat_server"]) if "chat_server" in given else None, chat_key=key,
                    images=tuple(_url(u, "--image-server") for u in str(given.get("image_server", "")).split(",")
                                 if u.strip()))
    for flag, elsewhere, engine in (("--chat-server", found.chat, "chat"), ("--image-server", found.images, "image")):
        if elsewhere and (not getattr(settings, engine) or shards(settings, engine)):
            raise ConfigError(flag, f"runs the {engine} on other servers, but this one disables or shards it (--no-"
                              f"{engine}, --tp with --tp-engine {engine})", f"leave out {flag} or those flags")
    return found


def plug(settings: Settings) -> Parts:
    found = servers(settings)
    elsewhere = {}
    if found.chat:
        elsewhere["chat"] = Elsewhere((found.chat,), "OpenAI-compatible server")
    if found.images:
        elsewhere["image"] = Elsewhere(found.images, "image workers")
    if not elsewhere:
        return Parts()

    def remote(settings: Settings):
        from . import RemoteEngines

        return RemoteEngines(settings, found)

    return Parts(elsewhere=elsewhere, remote=remote)


def _url(text: object, flag: str = "--chat-server") -> str:
    parts = urllib.parse.urlsplit(url := str(text).strip().rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(flag, f"{url!r} is not an http(s) URL", "a worker's base URL, e.g. http://127.0.0.1:7861"
                          if flag == "--image-server" else "an OpenAI base URL, e.g. http://127.0.0.1:8000/v1 "
                          "(vLLM) or http://127.0.0.1:7860/v1 (this app with --no-image)")
    return url
