"""Login hardening as a plug-in: ``--login-max-age``, and under ``--auth`` (the core's flag, Gradio's login) the
login guard as a layer in the core's edge, around its body limit and guards. Without ``--auth`` it adds nothing: no
login code runs on a request."""

from __future__ import annotations

from neuron_backend.errors import ConfigError
from neuron_backend.plugins import Layer, Parts
from neuron_backend.settings import Settings, add_flag, as_float

from .throttle import LoginThrottle


def add_flags(parser) -> None:
    add_flag(parser.add_argument_group("login hardening, with --auth (tools/login)"), "login-max-age", "float",
             "hours a login lasts; an older login token is forgotten and its browser logs in again")


def login_max_age_h(settings: Settings) -> float:
    """--login-max-age (the plug-in's flag), checked: hours, more than 0; default 24."""
    hours = as_float("login-max-age", settings.options.get("login_max_age", 24.0))
    if not hours > 0:
        raise ConfigError("--login-max-age", f"{hours} is not positive", "hours, more than 0")
    return hours


def plug(settings: Settings, throttle: LoginThrottle | None = None) -> Parts:
    """The login guard when ``settings.auth`` is set, else nothing. ``throttle``: the backoff (a test's own)."""
    max_age_h = login_max_age_h(settings)
    if settings.auth is None:
        return Parts()
    from .guard import LoginGuard

    guard = {"auth": settings.auth, "throttle": throttle or LoginThrottle(), "max_age_s": max_age_h * 3600,
             "max_body": settings.max_request_bytes}
    return Parts(middleware=(Layer(LoginGuard, guard),))
