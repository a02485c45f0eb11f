"""What users wait for, in the metrics: queue wait and end-to-end time of the page's and API's events, refusals.

The clock of a web request starts when its event joined Gradio's queue: Gradio 6.31's queue keeps each
waiting or running event in ``blocks._queue.event_ids_to_events`` with ``enqueue_time``
(``time.monotonic()`` at ``POST /gradio_api/queue/join``), and sets ``LocalContext.event_id`` and
``LocalContext.blocks`` around every call of a handler. A handler called outside the queue (a test, an
unqueued event) starts its clock at its first line. The clock stops when the handler's last update has
been taken (its generator ended or was closed), so a refusal's time counts too. The joins refused before any
handler ran are counted by the core's edge (ui/guards.py).
"""

from __future__ import annotations

import inspect
import time
from contextlib import aclosing
from functools import wraps

from gradio.context import LocalContext

from neuron_backend.errors import ShowcaseError
from neuron_backend.metrics import Metrics, refusal_reason


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
