"""The backend's messages in English and Arabic, one data module per wing (no imports, so any module
may use them); ``neuron_backend.messages`` looks keys up here and ``ui/i18n.py`` merges them into the
page's one table."""

from . import chat, common, image

PARTS = {"common": common.MESSAGES, "chat": chat.MESSAGES, "image": image.MESSAGES}
