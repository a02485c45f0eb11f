"""The one seam for what is optional: a plug-in is a module with ``add_flags(parser)`` and ``plug(settings)``.

``plug`` checks the plug-in's flags (``settings.options``; a ``ConfigError`` naming the flag) and returns the
``Parts`` it adds; no core module knows a plug-in's name. The seam: docs/architecture.md, "The one seam".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Tab:
    """A tab after the core's two."""

    label: str  # a key of the page's words (a plug-in registers its Arabic with messages.register)
    elem_id: str
    build: Callable[[object], object]  # build(backend), called inside the gr.Tab


@dataclass(frozen=True)
class Layer:
    """ASGI middleware a plug-in puts around the core's body limit and guards (inside the core's count of refused
    queue joins): ``cls(app, **kwargs)``. With a ``prefix`` ("/v1") only requests whose path is it or under it enter
    it; every other request passes it by, so its code runs only for its own paths."""

    cls: Callable[..., object]
    kwargs: Mapping[str, object] = field(default_factory=dict)
    prefix: str = ""  # "": every request


@dataclass(frozen=True)
class Elsewhere:
    """An engine that runs on other servers, not in this process."""

    servers: tuple[str, ...]  # base URLs; the warm-up connects to each
    served_by: str  # what serves it there, as the page says: "OpenAI-compatible server", "image workers"


@dataclass(frozen=True)
class ChatBatch:
    """Chat replies served together: every compiled chat shape has ``rows`` rows."""

    rows: int
    runner: Callable[[object], object]  # runner(the loaded chat engine) -> an object with warm_up(ids, bucket,
    #                                     floor) and stream(request, prompt, stop) -> ChatUpdates


@dataclass(frozen=True)
class Sharding:
    """One engine split over the ranks of a process group (torchrun). The core knows only what placing it needs:
    which engine, over how many ranks (the rank is the settings'); the rest are the plug-in's callables."""

    engine: str  # "chat" or "image"
    count: int  # shards, one per rank: the placement's ``tp``
    load_kwargs: Callable[[str, object], dict]  # load_kwargs(engine, placement) -> from_pretrained keywords of a shard
    attach: Callable[[str, object], None]  # attach(name, engine), rank 0: set its on_generate and agree_stop
    join: Callable[[object, Parts], None]  # join(settings, parts), before the Backend; a follower ends in it
    release: Callable[[], None]  # rank 0 after serving: release the followers, close the groups
    end: Callable[[], None]  # rank 0, last: end the process


@dataclass(frozen=True)
class Parts:
    """What plug-ins add. Merged in the plug-ins' order (``merged``): sequences joined, mappings updated, the
    first ``remote``, ``command``, ``chat_batch``, ``sharding`` and ``demo_models`` kept."""

    hooks: tuple = ()  # warm-up hook factories: make(backend) -> an object with plan/started/ended (warmup.py)
    elsewhere: Mapping[str, Elsewhere] = field(default_factory=dict)  # engines run on other servers
    remote: Callable[[object], object] | None = None  # remote(settings): .connect(engine, url, task) -> the engine
    #                                                    of ``elsewhere``, .shape_states() -> the workers' sizes
    tabs: tuple[Tab, ...] = ()
    chat_extras: tuple = ()  # extra(backend, form): a row under the chat, wired to the Chat tab's form
    image_extras: tuple = ()  # extra(backend, form): a block in the Image tab's settings, wired to its form
    details: tuple = ()  # detail(backend): a block in the warm-up details
    routes: tuple = ()  # routes(backend) -> Starlette routes served beside the page
    middleware: tuple[Layer, ...] = ()  # ASGI middleware around the core's body limit and guards, outermost first
    page_hooks: tuple = ()  # hook(demo, backend) -> a FastAPI lifespan or None, called with the built page
    launch: Mapping[str, object] = field(default_factory=dict)  # keywords for Gradio's launch()
    command: Callable[[object, Parts], int] | None = None  # run instead of serving: command(settings, parts) -> exit
    compiled: tuple = ()  # wrap(engine, target, config, placement, settings, variant) -> handle|None (wrap_compiled)
    chat_batch: ChatBatch | None = None  # the chat's replies served N at a time; None: one at a time
    sharding: Sharding | None = None  # one engine sharded over torchrun ranks (placements read it); None: whole
    demo_models: Callable[[object, str], Path] | None = None  # demo_models(settings, engine) -> the folder of the
    #                                                          engine's offline demo model, built if needed; None:
    #                                                          the demo models (--models tiny) cannot be served

    @property
    def chat_rows(self) -> int:
        """The rows of every compiled chat shape: the chat batch's, else 1."""
        return 1 if self.chat_batch is None else self.chat_batch.rows


def merged(parts: Iterable[Parts]) -> Parts:
    """One ``Parts`` of many: sequences joined, mappings updated, the first ``remote``, ``command``, ``chat_batch``,
    ``sharding``, ``demo_models``."""
    out: dict[str, object] = {f.name: getattr(Parts(), f.name) for f in dataclasses.fields(Parts)}
    for part in parts:
        for f in dataclasses.fields(Parts):
            value = getattr(part, f.name)
            if isinstance(value, tuple):
                out[f.name] = (*out[f.name], *value)
            elif isinstance(value, Mapping):
                out[f.name] = {**out[f.name], **value}
            elif out[f.name] is None:
                out[f.name] = value
    return Parts(**out)


def plug_all(plugins: Iterable, settings) -> Parts:
    """Each plug-in's parts for these settings, merged."""
    return merged(plugin.plug(settings) for plugin in plugins)


def wrap_compiled(wrappers: Iterable[Callable], engine: str, target, compile_config: dict, placement, settings,
                  variant: str = ""):
    """The handle of the first of ``wrappers`` that takes ``engine``'s compiled forward (``target``: the chat model,
    the image transformer), or None: the engine keeps its plain compiled call. ``variant``: the engine's own choices
    that change its graphs. A handle's ``refused_saves`` and ``save_errors`` reach the warm-up's notes."""
    for wrap in wrappers:
        if (handle := wrap(engine, target, compile_config, placement, settings, variant)) is not None:
            return handle
    return None
