"""The backoff for failed logins: after ``free_failures`` wrong tries a client's key waits, the wait doubling up to
``max_delay_s``; a success forgets the key. Used by the login guard (key: address and user name) and by /v1's
API keys (key: address)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

MAX_TRACKED = 10_000  # keys remembered; the oldest are forgotten first


class LoginThrottle:
    """Backoff for failed logins per client key. ``clock`` is injectable.

    Not locked: its callers run on the server's event loop, each read and its update in one coroutine step.
    """

    def __init__(self, free_failures: int = 5, base_delay_s: float = 1.0, max_delay_s: float = 60.0,
                 forget_after_s: float = 900.0, clock: Callable[[], float] = time.monotonic):
        self.free_failures, self.base_delay_s, self.max_delay_s = free_failures, base_delay_s, max_delay_s
        self.forget_after_s, self.clock = forget_after_s, clock
        self._clients: OrderedDict[object, tuple[int, float, float]] = OrderedDict()  # failures, last, locked until

    def retry_after(self, client) -> float:
        """Seconds before ``client`` may try to log in again (0: now)."""
        entry = self._clients.get(client)
        if entry is None:
            return 0.0
        failures, last, locked_until = entry
        now = self.clock()
        if now - last > self.forget_after_s:
            del self._clients[client]
            return 0.0
        return max(0.0, locked_until - now)

    def failed(self, client) -> None:
        now = self.clock()
        failures, _, _ = self._clients.pop(client, (0, now, now))
        failures += 1
        over = failures - self.free_failures
        wait = 0.0 if over <= 0 else min(self.base_delay_s * 2 ** (over - 1), self.max_delay_s)
        self._clients[client] = (failures, now, now + wait)
        while len(self._clients) > MAX_TRACKED:
            self._clients.popitem(last=False)

    def succeeded(self, client) -> None:
        self._clients.pop(client, None)
