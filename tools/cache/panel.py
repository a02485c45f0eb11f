"""The operator's Export button in the warm-up details: the compile cache packed as a bundle for another host.

Offered only under ``--auth`` (an operator action: it writes large files); an anonymous page gets a note
naming the flag and the command instead. ``app.py`` hands ``build_export`` to ``ui.serve(details=…)``.
"""

from __future__ import annotations

import gradio as gr

from neuron_backend.errors import InvalidRequestError
from neuron_backend.messages import msg
from neuron_backend.runtime import Backend
from ui.api import user_errors
from ui.i18n import t
from ui.status_panel import operator_actions

from . import warm_start


def build_export(backend: Backend) -> None:
    """The Export button and its file (call inside the warm-up details accordion)."""
    if operator_actions(backend):
        with gr.Row():
            bundle_btn = gr.Button(t("status_export_bundle"), size="sm", elem_id="export-bundle")
            bundle_file = gr.File(label=t("status_bundle_file"), height=90, elem_id="bundle-file")
        bundle_btn.click(press_export_bundle(backend), None, bundle_file, api_visibility="private")
    else:  # not offered: no button, no event to call; the note says where the action lives
        gr.Markdown(t("status_export_operator_only"), elem_id="export-bundle-note")


def press_export_bundle(backend: Backend):
    """The Export button's handler: refused unless the request is a logged-in user's."""

    @user_errors
    def export_bundle(request: gr.Request):
        if not operator_actions(backend) or not getattr(request, "username", None):
            raise InvalidRequestError(msg("err_operator_only"))
        return str(warm_start.of(backend).export())

    return export_bundle
