"""The /v1 series in the Backend's Prometheus registry: requests by route and HTTP status, errors by OpenAI
error type, chat tokens; and each route's end-to-end time in the core's latency histogram."""

from __future__ import annotations

from prometheus_client import Counter

ENDPOINTS = {"models": "/v1/models", "chat": "/v1/chat/completions", "images": "/v1/images/generations",
             "edits": "/v1/images/edits", "files": "/v1/images/files"}


class V1Metrics:
    """Made once per Backend (``v1_metrics``); exports zeros before the first request."""

    def __init__(self, metrics) -> None:
        r = metrics.registry
        self.requests = Counter("showcase_v1_requests", "OpenAI-compatible /v1 requests by route (models, chat, "
                                "images, edits, files) and HTTP status", ["route", "status"], registry=r)
        self.errors = Counter("showcase_v1_errors", "/v1 requests answered with an error, by route and OpenAI "
                              "error type", ["route", "type"], registry=r)
        self.tokens = Counter("showcase_v1_tokens", "/v1 chat tokens by kind (prompt, completion)", ["kind"],
                              registry=r)
        for kind in ("prompt", "completion"):
            self.tokens.labels(kind)
        for path in ENDPOINTS.values():
            metrics.latency.labels(path)

    def answered(self, route: str, status: int, error_type: str | None = None) -> None:
        """One answered /v1 request (an error also under its OpenAI error type)."""
        self.requests.labels(route, str(status)).inc()
        if error_type is not None:
            self.errors.labels(route, error_type).inc()

    def used(self, prompt: int, completion: int) -> None:
        """One chat reply's usage."""
        self.tokens.labels("prompt").inc(prompt)
        self.tokens.labels("completion").inc(completion)


def v1_metrics(metrics) -> V1Metrics:
    """The /v1 series of this Backend's metrics, registered on first use."""
    return metrics.own("v1", V1Metrics)
