"""The core's metrics on their own: zeros before the first request, refusal labels, a plug-in's own series made
once; every scrape parsed by prometheus_client's own text parser (promtool, a Go binary, is not installed here).
The series read when scraped are the probes plug-in's: tests/tools/test_probes.py."""

from __future__ import annotations

from support.scrape import scrape, value

from neuron_backend.errors import (
    BusyError,
    CancelledError,
    EngineUnavailableError,
    InvalidRequestError,
    ShapeFailedError,
    ShapeNotReadyError,
    ShowcaseError,
    UnsupportedSizeError,
)
from neuron_backend.metrics import REFUSAL_REASONS, Metrics, refusal_reason
from neuron_backend.runtime import Backend


def test_refusals_have_a_fixed_reason_set():
    assert refusal_reason(UnsupportedSizeError("x")) == refusal_reason(InvalidRequestError("x")) == "bad_input"
    assert refusal_reason(BusyError("x")) == "busy"
    assert refusal_reason(ShapeNotReadyError("x", "64x64")) == refusal_reason(EngineUnavailableError("x")) \
        == "not_ready"
    assert refusal_reason(ShapeFailedError("x")) == "failed_shape"
    assert refusal_reason(ShowcaseError("anything")) == "other"
    assert refusal_reason(CancelledError("x")) is None  # a cancel is no refusal
    metrics = Metrics()
    metrics.refused("/chat", "bad_input")
    metrics.refused("/chat", "a free text that must not become a label")
    samples = scrape(metrics)
    assert value(samples, "showcase_refusals_total", endpoint="/chat", reason="bad_input") == 1
    assert value(samples, "showcase_refusals_total", endpoint="/chat", reason="other") == 1
    assert {dict(k[1])["reason"] for k in samples if k[0] == "showcase_refusals_total"} <= set(REFUSAL_REASONS)


def test_the_cores_series_export_zeros_before_the_first_request(tiny_settings):
    """rate() and histogram_quantile() work from the first scrape; the scrape-time series are the probes'
    (tests/tools/test_probes.py)."""
    samples = scrape(Backend(tiny_settings).metrics)
    assert value(samples, "showcase_request_duration_seconds_count", endpoint="/chat") == 0
    assert value(samples, "showcase_queue_wait_seconds_count", endpoint="chat_tab") == 0
    assert value(samples, "showcase_requests_total", endpoint="image", outcome="ok") == 0
    assert not [key for key in samples if key[0].startswith(("showcase_warmup_", "showcase_build_info"))]


def test_a_plug_ins_own_series_are_made_once_per_registry():
    from prometheus_client import Counter

    metrics, made = Metrics(), []

    def make(m):
        made.append(m)
        return Counter("showcase_plugged", "A plug-in's counter", registry=m.registry)

    first = metrics.own("plugged", make)
    assert metrics.own("plugged", make) is first and made == [metrics]  # a second registration would raise
    first.inc()
    assert b"showcase_plugged_total 1.0" in metrics.exposition()
