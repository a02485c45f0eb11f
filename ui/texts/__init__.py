"""The page's words in English and Arabic, one module per room; ``ui/i18n.py`` merges them with the
backend's messages (``neuron_backend/texts``) into the one ``gr.I18n`` table."""

from . import chat, common, image

PARTS = {"common": common.WORDS, "chat": chat.WORDS, "image": image.WORDS}
