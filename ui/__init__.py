"""The Gradio UI: composes the page from the status panel, the tabs and the public API. Gradio lives here only."""

from __future__ import annotations

import gradio as gr

from neuron_backend.runtime import Backend

from .api import add_public_api
from .chat_tab import build_chat_tab
from .image_tab import build_image_tab
from .qa_tab import build_qa_tab
from .status_panel import build_status_panel, wire_refresh


def create_demo(backend: Backend) -> gr.Blocks:
    """Build the Blocks; every event calls into ``backend``."""
    settings = backend.settings
    # Engines on the same device share one queue slot; on different devices they run in parallel.
    concurrency = {name: f"device-{p.device}" for name, p in backend.placements.items()}
    if settings.chat_batch > 1:  # N batch slots: N chat replies at once, in a group of their own
        concurrency["chat"] = "chat-batch"

    # delete_cache: Gradio copies every served file into its cache; drop copies older than an hour, hourly.
    with gr.Blocks(title="Hugging Face on Trainium", delete_cache=(3600, 3600)) as demo:
        panel = build_status_panel(backend)
        with gr.Tab("Chat", visible="chat" in backend.placements, elem_id="chat-tab"):
            build_chat_tab(backend)
        with gr.Tab("Image", visible="image" in backend.placements, elem_id="image-tab"):
            image = build_image_tab(backend, concurrency)
        with gr.Tab("QA bench", elem_id="qa-tab"):
            build_qa_tab(backend)
        wire_refresh(demo, backend, panel, image)
        add_public_api(backend, concurrency)
    return demo


def serve(backend: Backend, **kwargs):
    """Build the page, set up the queue and launch it with the settings' host, port and auth."""
    settings = backend.settings
    demo = create_demo(backend)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=1)
    launched = demo.launch(server_name=settings.host, server_port=settings.port, share=settings.share,
                           auth=settings.auth, show_error=True, **kwargs)
    return demo, launched
