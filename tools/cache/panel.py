"""The operator's Export button in the warm-up details: the compile cache packed as a bundle for another host.

Offered only under ``--auth`` (an operator action: it writes large files); an anonymous page gets a note
naming the flag and the command instead. The plug-in (``plugin.py``) hands ``build_export`` to the page.
"""

from __future__ import annotations

import gradio as gr

from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import tr
from neuron_backend.runtime import Backend
from ui.api import user_errors
from ui.i18n import t
from ui.status_panel import operator_actions

from . import warm_start


def build_export(backend: Backend) -> None:
    """The Export button and its file (call inside the warm-up details accordion)."""
    if operator_actions(backend):
        with gr.Row():
            bundle_btn = gr.Button(t("Export compile cache (bundle for another host)"), size="sm",
                                   elem_id="export-bundle")
            bundle_file = gr.File(label=t("Compile-cache bundle (.tar.gz; start another host with --cache-bundle and "
                                          "--cache-bundle-sha256, its sha256: "
                                          "python -m tools.cache show prints it)"), height=90, elem_id="bundle-file")
        bundle_btn.click(press_export_bundle(backend), None, bundle_file, api_visibility="private")
    else:  # not offered: no button, no event to call; the note says where the action lives
        gr.Markdown(t("Exporting the compile cache is an operator action: it is offered to a logged-in user when the "
                      "app runs with `--auth`. On the server: `python -m tools.cache "
                      "export OUT.tar.gz`."), elem_id="export-bundle-note")


def press_export_bundle(backend: Backend):
    """The Export button's handler: refused unless the request is a logged-in user's."""

    @user_errors
    def export_bundle(request: gr.Request):
        if not operator_actions(backend) or not getattr(request, "username", None):
            raise InvalidRequestError(tr("Exporting the compile cache is an operator action: start the app with "
                                         "--auth and log in."))
        return str(warm_start.of(backend).export())

    return export_bundle
