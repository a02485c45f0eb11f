"""Login hardening under ``--auth``: failed logins back off, login tokens expire, a job is joined and cancelled
only by its own login, ``/metrics`` and MCP ask for a login (``throttle.py``: the backoff; ``guard.py``: the
middleware; ``plugin.py``: ``--login-max-age`` and the middleware, installed only with ``--auth``)."""
