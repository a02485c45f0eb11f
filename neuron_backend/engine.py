"""What the chat and image engines share: the readiness of their static shapes.

Every engine exposes the same small surface, which the warm-up runner and the app rely on::

    name: str                       # "chat" or "image"
    model_id: str                   # hub id or folder the user asked for
    placement: Placement            # from devices.resolve_placements
    shapes: ShapeRegistry           # one entry per static shape, in warm-up order
    load(folder: Path) -> None      # from_pretrained from a local folder, explicit placement
    warm_up(shape: str) -> None     # run one shape once (compiles it); marks it ready or failed
    cancel() -> None                # stop the running request within one step
    describe() -> dict              # plain data for the UI

Engines raise only ``errors.ShowcaseError`` subclasses for things a user can cause or fix.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .errors import ShapeFailedError, ShapeNotReadyError
from .messages import Message, tr

PENDING, READY, FAILED = "pending", "ready", "failed"

ENGINE_WORDS = {"chat": tr("chat"), "image": tr("image")}  # engine names inside sentences, lower case


def engine_name(name: str) -> Message | str:
    """An engine's name inside a sentence ("chat"; Arabic on the page), as a message."""
    return ENGINE_WORDS.get(name, name)


@dataclass
class ShapeState:
    state: str = PENDING
    reason: str | None = None


class ShapeRegistry:
    """Thread-safe state of each declared shape of one engine.

    While ``gated`` (set by the warm-up runner once it has planned the warm-up), a request for
    a shape that is not ready is refused instead of compiling it on the request path.
    """

    def __init__(self, engine: str, keys: list[str]):
        self.engine = engine
        self._states = {key: ShapeState() for key in keys}
        self._lock = threading.Lock()
        self.gated = False
        self.eager: dict[str, str] = {}  # shape -> the compile error it fell back from (devices.compile_or_eager)

    def keys(self) -> list[str]:
        return list(self._states)

    def mark_ready(self, key: str) -> None:
        with self._lock:
            self._states[key] = ShapeState(READY)

    def mark_failed(self, key: str, reason: str) -> None:
        with self._lock:
            self._states[key] = ShapeState(FAILED, reason)

    def state(self, key: str) -> ShapeState:
        with self._lock:
            return ShapeState(**vars(self._states[key]))

    def ready_keys(self) -> list[str]:
        with self._lock:
            return [k for k, s in self._states.items() if s.state == READY]

    def require(self, key: str, label: str | None = None) -> None:
        """Raise unless ``key`` may serve a request now."""
        state = self.state(key)
        label = label or key
        if state.state == FAILED:
            raise ShapeFailedError(tr("{engine} shape {label} is unavailable: its warm-up failed ({reason}).",
                                      engine=engine_name(self.engine), label=label,
                                       reason=state.reason))
        if state.state == PENDING and self.gated:
            raise ShapeNotReadyError(tr("{engine} shape {label} is still warming up (compiling); try again soon.",
                                        engine=engine_name(self.engine), label=label), key)

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            return {k: {"state": s.state, "reason": s.reason} for k, s in self._states.items()}


class SerialJobs:
    """One request at a time per engine, each with its own cancel event.

    Concurrency: callers that arrive while a job runs block in ``job()`` until it ends (they
    are not dropped); ``cancel()`` stops only the job running now, not the waiting ones.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: threading.Event | None = None

    def job(self, cancel: threading.Event | None = None):
        """Context manager for one job; ``cancel`` lets the caller stop just its own request."""
        return _Job(self, cancel)

    def cancel(self) -> bool:
        """Ask the running job to stop; return whether one was running."""
        current = self._current
        if current is None:
            return False
        current.set()
        return True

    @property
    def busy(self) -> bool:
        return self._lock.locked()


class _Job:
    def __init__(self, owner: SerialJobs, cancel: threading.Event | None):
        self._owner = owner
        self.cancelled = cancel if cancel is not None else threading.Event()

    def __enter__(self) -> threading.Event:
        self._owner._lock.acquire()
        self._owner._current = self.cancelled
        return self.cancelled

    def __exit__(self, *exc) -> None:
        self._owner._current = None
        self._owner._lock.release()
