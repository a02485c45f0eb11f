"""The Gradio UI: composes the page from the status panel, the tabs and the public API. Gradio lives here only."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path

import gradio as gr
import httpx
from gradio import networking
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from neuron_backend.plugins import Layer, Parts, Tab
from neuron_backend.runtime import Backend

from .accessibility import CSS as A11Y_CSS
from .accessibility import FONT_PRELOAD, THEME
from .accessibility import HEAD as A11Y_HEAD
from .api import add_public_api
from .chat_tab import CHAT_CSS, ChatExtra, build_chat_tab
from .guards import EarlyCancels, Edge, session_jobs
from .i18n import CSS, HEAD, I18N, t
from .image_tab import IMAGE_CSS, ImageExtra, build_image_tab
from .status_panel import STATUS_CSS, build_status_panel, wire_refresh


def create_demo(backend: Backend, cancels: EarlyCancels | None = None, tabs: Sequence[Tab] = (),
                details: Sequence[Callable[[Backend], object]] = (),
                chat_extras: Sequence[ChatExtra] = (), image_extras: Sequence[ImageExtra] = ()) -> gr.Blocks:
    """Build the Blocks; every event calls into ``backend``. ``cancels``: shared with the guards (launch_kwargs);
    ``tabs``: added after Chat and Image, in order; ``details``: added to the warm-up details; ``chat_extras``:
    rows under the chatbot; ``image_extras``: blocks under the Image tab's settings (the plug-ins' parts)."""
    cancels = cancels or EarlyCancels()
    # Engines on the same device share one queue slot; on different devices they run in parallel.
    concurrency = {name: f"device-{p.device}" for name, p in backend.placements.items()}
    if backend.chat_slots() > 1:  # N batch slots (or a chat server): N replies at once, in a group of their own
        concurrency["chat"] = "chat-batch"

    # delete_cache: Gradio copies every served file into its cache; drop copies older than an hour, hourly.
    with gr.Blocks(title="Hugging Face on Trainium", delete_cache=(3600, 3600)) as demo:
        panel = build_status_panel(backend, details)
        with gr.Tab(t("Chat"), visible="chat" in backend.placements, elem_id="chat-tab"):
            build_chat_tab(backend, chat_extras)
        with gr.Tab(t("Image"), visible="image" in backend.placements, elem_id="image-tab"):
            image = build_image_tab(backend, concurrency, cancels, image_extras)
        for tab in tabs:
            with gr.Tab(t(tab.label), elem_id=tab.elem_id):
                tab.build(backend)
        wire_refresh(demo, backend, panel, image)
        add_public_api(backend, concurrency, cancels)
    return demo


def launch_kwargs(backend: Backend, demo: gr.Blocks, cancels: EarlyCancels | None = None,
                  routes: Sequence[BaseRoute] = (), lifespans: Sequence[Callable] = (),
                  middleware: Sequence[Layer] = ()) -> dict:
    """Everything ``demo.launch`` gets: address, auth, the only folders files are served from, upload and
    body limits, the core's edge (ui/guards.py); ``lifespans`` are entered in order when the server starts;
    ``middleware`` (the plug-ins' layers) goes inside the edge's refusal counter, around its body limit."""
    settings = backend.settings
    app_kwargs = {
        # The plug-ins' routes (the probes', the /v1 API's), as FastAPI routes from the server's first request
        "routes": list(routes),
        # The one middleware: what every request passes before Gradio, the plug-ins' layers inside it
        "middleware": [Middleware(Edge, metrics=backend.metrics, max_bytes=settings.max_request_bytes,
                                  max_upload_bytes=settings.max_file_size, early_cancels=cancels,
                                  session_jobs=session_jobs(demo), max_session_jobs=settings.max_session_jobs,
                                  pages=[f"/{page}" for page, *_ in demo.pages], layers=middleware)],
    }
    if lifespans:
        app_kwargs["lifespan"] = _all_of(lifespans)
    return {
        "server_name": settings.host,
        "server_port": settings.port,
        "share": settings.share,
        "auth": settings.auth,
        "show_error": True,
        # Generated images and exports live under the cache root, which may sit outside the working
        # directory and the temp dir (the default ~/.cache/...): name exactly those two folders.
        "allowed_paths": [str(p) for p in backend.served_folders()],
        "max_file_size": settings.max_file_size,  # Gradio's own check of each uploaded file (413 above)
        "app_kwargs": app_kwargs,
        "mcp_server": False,  # Gradio's MCP server (else read from GRADIO_MCP_SERVER): a plug-in's part turns it on
        # English and Arabic (ui/i18n.py): the string table, ?lang= override and <html dir>, RTL text
        "i18n": I18N,
        "head": FONT_PRELOAD + HEAD + A11Y_HEAD,
        "theme": THEME,  # colours at WCAG AA contrast (ui/accessibility.py)
        "css": CSS + CHAT_CSS + IMAGE_CSS + A11Y_CSS + STATUS_CSS,
    }


def _all_of(lifespans: Sequence[Callable]) -> Callable:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with contextlib.AsyncExitStack() as stack:
            for each in lifespans:
                await stack.enter_async_context(each(app))
            yield

    return lifespan


def own_gradio_folder(port: int, env: MutableMapping[str, str] = os.environ) -> Path:
    """Give this server a Gradio folder of its own, ``<GRADIO_TEMP_DIR, else <temp dir>/gradio>/port-<port>``,
    and return it. Call once per process, before the page is built. Why: docs/configuration.md."""
    base = Path(env.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
    folder = base / f"port-{port}"
    env["GRADIO_TEMP_DIR"] = str(folder)
    return folder


GRADIO_URL_OK = networking.url_ok  # Gradio's own check, which serve() replaces with patient_url_ok


def patient_url_ok(url: str, tries: int = 5, timeout_s: float = 3.0) -> bool:
    """Gradio's start-up check that the server answers (``HEAD /``), up to ``tries`` answers of ``timeout_s`` each,
    a timeout retried like a bad status. Why: docs/configuration.md."""
    for _ in range(tries):
        try:
            if httpx.head(url, timeout=timeout_s, verify=False).status_code in (200, 401, 301, 302, 303, 307, 308):
                return True
        except httpx.TimeoutException:
            continue
        except httpx.HTTPError:
            return False
        time.sleep(0.5)
    return False


def serve(backend: Backend, parts: Parts = Parts(), **kwargs):
    """Build the page with the plug-ins' ``parts`` (tabs, details, chat and image extras; routes served beside the page;
    page hooks called with the built page; middleware layers inside the core's edge; launch keywords), set up the
    queue and launch it (``launch_kwargs``; ``kwargs`` add to or override them)."""
    settings = backend.settings
    cancels = EarlyCancels()  # the guards note early cancels, the API handlers drop those jobs
    demo = create_demo(backend, cancels, parts.tabs, parts.details, parts.chat_extras, parts.image_extras)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=1)
    lifespans = [span for span in (hook(demo, backend) for hook in parts.page_hooks) if span is not None]
    routes = [route for make in parts.routes for route in make(backend)]
    # Gradio's waiting events over every concurrency group (Queue.__len__): what a scrape and /v1's admission read
    backend.metrics.queue_depth = lambda: len(demo._queue)
    # Gradio starts uvicorn without proxy settings; uvicorn reads the peers whose X-Forwarded-For it trusts
    # from this variable as the server starts (its own default: 127.0.0.1 and ::1, i.e. anyone on this host).
    os.environ["FORWARDED_ALLOW_IPS"] = settings.forwarded_allow_ips
    networking.url_ok = patient_url_ok
    launched = demo.launch(**{**launch_kwargs(backend, demo, cancels, routes, lifespans, parts.middleware),
                              **parts.launch, **kwargs})
    return demo, launched
