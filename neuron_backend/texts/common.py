"""Messages every room may show (requests, engines, warm-up, the compile cache): key -> (English, Arabic); {name} fields
are filled with the message's parameters (``neuron_backend.messages.msg``)."""

MESSAGES: dict[str, tuple[str, str]] = {
}
