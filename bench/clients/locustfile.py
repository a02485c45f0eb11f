"""locust users that chat through the app's Gradio HTTP API (``/gradio_api/call/chat``), on loopback.

    python app.py --models tiny --device cpu --no-image --max-new-tokens 32 --port 7873 &
    locust -f bench/clients/locustfile.py --headless -u 16 -r 4 -t 60s --host http://127.0.0.1:7873

Each request is Gradio's two-step HTTP call (POST the inputs, then read the event stream to its
``complete`` event), timed as the client waits for it, queue included, and reported to locust as
``CHAT /chat``. Compare locust's percentiles with ``showcase_request_duration_seconds{endpoint="/chat"}``
and ``showcase_queue_wait_seconds`` from ``/metrics`` (docs/api.md, "Metrics"). gradio_client does not
run under locust's gevent (its trio import needs ``select.epoll``), hence plain HTTP.
"""

from __future__ import annotations

import json
import random
import time

from locust import HttpUser, between, task


class ChatUser(HttpUser):
    wait_time = between(0.5, 2.0)

    @task
    def chat(self):
        started, error = time.perf_counter(), None
        prompt = f"Say something about Trainium #{random.randint(0, 999)}"
        try:
            posted = self.client.post("/gradio_api/call/chat", json={"data": [prompt, None, "", False, 0.7, 0.8,
                                                                          20, 16, False, None]},
                                      name="join", timeout=120)
            posted.raise_for_status()
            event = posted.json()["event_id"]
            with self.client.get(f"/gradio_api/call/chat/{event}", stream=True, name="stream",
                                 timeout=300, catch_response=True) as stream:
                kind = None
                for line in stream.iter_lines(decode_unicode=True):
                    if line.startswith("event: "):
                        kind = line[len("event: "):]
                    elif line.startswith("data: ") and kind == "error":
                        raise RuntimeError(json.loads(line[len("data: "):]))
                    if kind == "complete":
                        break
                stream.success()  # the stream is read; the request below says whether the chat completed
                if kind != "complete":
                    raise RuntimeError(f"the stream ended with {kind!r}")
        except Exception as exc:  # noqa: BLE001 - a refused or failed request is counted by locust, not raised
            error = exc
        self.environment.events.request.fire(request_type="CHAT", name="/chat", response_time=1000 * (
            time.perf_counter() - started), response_length=0, exception=error, context={})
