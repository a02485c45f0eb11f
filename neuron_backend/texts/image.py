"""The image engine's messages: key -> (English, Arabic); {name} fields
are filled with the message's parameters (``neuron_backend.messages.msg``)."""

MESSAGES: dict[str, tuple[str, str]] = {
    "image_stopped_before_start": ("Stopped before it started: no step ran and nothing was saved.",
                                   "أُوقِف قبل أن يبدأ: لم تُنفَّذ أي خطوة ولم يُحفَظ شيء."),
}
