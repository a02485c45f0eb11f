"""The QA bench as a plug-in: its tab, the 👍/👎 feedback row under the chat (marks the bench reads as a prompt
set), and ``--feedback-max-bytes``."""

from __future__ import annotations

from neuron_backend.plugins import Parts, Tab
from neuron_backend.settings import Settings, add_flag

from .feedback import feedback_max_bytes


def add_flags(parser) -> None:
    add_flag(parser.add_argument_group("QA bench and feedback (tools/qa)"), "feedback-max-bytes", "int",
             "bytes of the feedback file before it rotates (4 rotations, then marks are refused)")


def _build_tab(backend) -> None:
    from .tab import build_qa_tab

    build_qa_tab(backend)


def _feedback_row(backend, form):
    from .feedback_row import wire_feedback

    return wire_feedback(backend, form)


TAB = Tab("QA bench", "qa-tab", _build_tab)


def plug(settings: Settings) -> Parts:
    feedback_max_bytes(settings)
    return Parts(tabs=(TAB,), chat_extras=(_feedback_row,))
