"""Engines on other servers: ``--chat-server URL`` (an OpenAI-compatible server: vLLM Neuron, or this app with
``--no-image``) and ``--image-server URL[,URL…]`` (image workers: this app with ``--no-chat``).

``plugin.py`` reads the flags; ``RemoteEngines`` is its ``remote`` part: for each server the warm-up plans one
connect task, which calls ``connect``; the engine it returns serves the tab, ``/chat``, ``/v1`` and the QA bench as
the in-process engine would. One image engine routes to every worker (``image.py``).
"""

from __future__ import annotations

import threading
from pathlib import Path

from neuron_backend.messages import read_catalog, register
from neuron_backend.settings import Settings

# the remote engines' Arabic joins the one catalog before any text is shown
register(read_catalog(Path(__file__).with_name("arabic.json")))


class RemoteEngines:
    """The engines of the ``servers``, connected one server at a time."""

    def __init__(self, settings: Settings, servers):
        self.settings, self.servers = settings, servers
        self.images = None  # the one image engine of every worker, made at the first worker's connect
        self._lock = threading.Lock()

    def connect(self, engine: str, url: str, task) -> object:
        """Reach the server at ``url`` and wait until it serves, reporting on the warm-up ``task``; the engine
        serves from the first server reached."""
        if engine == "chat":
            from .chat import RemoteChatEngine

            chat = RemoteChatEngine(self.settings, self.servers.chat, self.servers.chat_key)

            def said(text: str) -> None:  # the server's shapes ready so far, where it lists them (this app does)
                task.progress, task.detail = chat.warm_fraction, text

            chat.connect(said)
            return chat
        from .image import RemoteImageEngine

        with self._lock:
            images = self.images = self.images or RemoteImageEngine(self.settings, self.servers.images)

        def progress(fraction: float, text: str) -> None:
            task.progress, task.detail = fraction, text

        images.connect(url, progress)
        return images

    def shape_states(self) -> dict[str, dict]:
        """Per image size, as the workers last said (none before the first worker's connect)."""
        return self.images.shape_states() if self.images is not None else {}
