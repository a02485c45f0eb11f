"""The probes as a plug-in: ``/healthz``, ``/readyz`` and ``/metrics`` served beside the page, and the scrape-time
series registered in the Backend's registry when they are. No flags: app.py lists it first, so its routes come
before every other plug-in's."""

from __future__ import annotations

from neuron_backend.plugins import Parts
from neuron_backend.settings import Settings


def add_flags(parser) -> None:
    """None: the probes always answer (with ``--auth`` the login plug-in asks for a login on ``/metrics``)."""


def routes(backend):
    """The probe routes of ``backend``, its scrape-time series registered (once per Backend) before they answer."""
    from .collector import state_series
    from .routes import probe_routes

    state_series(backend)
    return probe_routes(backend)


def plug(settings: Settings) -> Parts:
    return Parts(routes=(routes,))
