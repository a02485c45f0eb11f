"""One scrape of a Backend's metrics, parsed by prometheus_client: samples keyed by name and labels."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def scrape(metrics) -> dict[tuple[str, tuple], float]:
    """Every sample of one scrape, keyed by (name, sorted labels); the text must parse, no series twice."""
    samples = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float | None:
    """One sample's value; None when the series is absent."""
    return samples.get((name, tuple(sorted(labels.items()))))
