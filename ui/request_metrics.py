"""What users wait for, in the metrics: queue wait and end-to-end time of the page's and API's events, refusals.

The clock of a web request starts when its event joined Gradio's queue: Gradio 6.31's queue keeps each
waiting or running event in ``blocks._queue.event_ids_to_events`` with ``enqueue_time``
(``time.monotonic()`` at ``POST /gradio_api/queue/join``), and sets ``LocalContext.event_id`` and
``LocalContext.blocks`` around every call of a handler. A handler called outside the queue (a test, an
unqueued event) starts its clock at its first line. The clock stops when the handler's last update has
been taken (its generator ended or was closed), so a refusal's time counts too.

``QueueRefusals`` counts the joins refused before any handler ran: Gradio's queue full (503) and a
login the guards refuse (401, 403).
"""

from __future__ import annotations

import inspect
import time
from contextlib import aclosing
from functools import wraps

from gradio.context import LocalContext

from neuron_backend.errors import ShowcaseError
from neuron_backend.metrics import QUEUE, Metrics, refusal_reason

JOIN_PATH = "/gradio_api/queue/join"


def queued_at() -> float:
    """When the running event joined Gradio's queue (``time.monotonic()``); now when it was not queued."""
    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    events = getattr(getattr(blocks, "_queue", None), "event_ids_to_events", None)
    event = events.get(event_id) if isinstance(events, dict) and event_id else None
    joined = getattr(event, "enqueue_time", None)
    return joined if isinstance(joined, float) else time.monotonic()


class RequestClock:
    """One request's clock, from ``since`` (default: the moment its event joined the queue); observes its
    queue wait when made (``waited`` false: a later event of a request whose wait was observed).

    ``finish`` observes the end-to-end time once (later calls do nothing); ``refused`` counts a refusal.
    """

    def __init__(self, metrics: Metrics, endpoint: str, since: float | None = None, waited: bool = True):
        self.metrics, self.endpoint = metrics, endpoint
        self.since = queued_at() if since is None else since
        self._done = False
        if waited:
            metrics.observe_queue_wait(endpoint, time.monotonic() - self.since)

    def refused(self, exc: ShowcaseError) -> None:
        reason = refusal_reason(exc)
        if reason is not None:
            self.metrics.refused(self.endpoint, reason)

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self.metrics.observe_latency(self.endpoint, time.monotonic() - self.since)


def measured(metrics: Metrics, endpoint: str, ends: bool = True):
    """A generator or async generator handler timed as one request of ``endpoint``: queue wait at its
    first line, refusals (ShowcaseError, counted then re-raised for the error boundary outside it), and
    the end-to-end time when it ends. With ``ends`` false only a refusal ends the request here: a later
    event (the Image tab's ``show_images``) ends it from the run's ``queued_at``.
    """

    def decorate(fn):
        if inspect.isasyncgenfunction(fn):

            @wraps(fn)
            async def async_gen_wrapper(*args, **kwargs):
                clock = RequestClock(metrics, endpoint)
                try:
                    async with aclosing(fn(*args, **kwargs)) as inner:
                        async for item in inner:
                            yield item
                except ShowcaseError as exc:
                    clock.refused(exc)
                    clock.finish()
                    raise
                finally:
                    if ends:
                        clock.finish()

            return async_gen_wrapper

        @wraps(fn)
        def gen_wrapper(*args, **kwargs):
            clock = RequestClock(metrics, endpoint)
            try:
                yield from fn(*args, **kwargs)
            except ShowcaseError as exc:
                clock.refused(exc)
                clock.finish()
                raise
            finally:
                if ends:
                    clock.finish()

        return gen_wrapper

    return decorate


def join_refusal_reason(status: int) -> str | None:
    """The refusal label of a refused queue join's HTTP status (None: not refused)."""
    if status < 400:
        return None
    if status in (401, 403):
        return "auth"
    if status in (429, 503):  # 503: Gradio's "Queue is full"
        return "busy"
    return "bad_input" if status < 500 else "other"


class QueueRefusals:
    """ASGI middleware: counts each ``POST /gradio_api/queue/join`` answered with a refusal (endpoint "queue").

    Outermost, so it also sees the guards' 401 and 403. Reads only the response's status line.
    """

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != JOIN_PATH:
            return await self.app(scope, receive, send)

        async def watching_send(message):
            if message["type"] == "http.response.start":
                reason = join_refusal_reason(message["status"])
                if reason is not None:
                    self.metrics.refused(QUEUE, reason)
            await send(message)

        return await self.app(scope, receive, watching_send)
