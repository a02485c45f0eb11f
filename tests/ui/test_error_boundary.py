"""The error boundary: backend refusals become toasts whose text never turns into live HTML."""

from __future__ import annotations

import gradio as gr
import pytest

from neuron_backend.errors import InvalidRequestError
from ui.api import refusals_as_toast, user_errors

PAYLOAD = "unknown setting '<img src=http://127.0.0.1:9/x onerror=alert(1)>'"


def test_user_errors_escape_what_the_message_echoes():
    @user_errors
    def handler():
        raise InvalidRequestError(PAYLOAD)

    with pytest.raises(gr.Error) as caught:
        handler()
    assert "<img" not in caught.value.message and "&lt;img src=http://127.0.0.1:9/x" in caught.value.message


def test_refusal_toasts_escape_too(monkeypatch):
    shown = []
    monkeypatch.setattr(gr, "Warning", lambda message, *a, **k: shown.append(message))

    @refusals_as_toast(outputs=1)
    def handler():
        raise InvalidRequestError(PAYLOAD)

    handler()
    assert shown and "<img" not in shown[0] and "&lt;img" in shown[0]


def test_a_refusal_is_one_log_line_not_a_traceback(caplog):
    @user_errors
    def handler():
        raise InvalidRequestError("Prompt is empty.")

    with caplog.at_level("INFO", logger="showcase.api"), pytest.raises(gr.Error) as caught:
        handler()
    # Gradio prints a traceback for a gr.Error unless print_exception is off (gradio/queueing.py, routes.py)
    assert caught.value.print_exception is False
    assert [r.getMessage() for r in caplog.records] == ["refused: InvalidRequestError: Prompt is empty."]
