"""The operator's probes: ``GET /healthz``, ``/readyz`` (``?shape=LABEL`` for one shape) and ``/metrics``, with the
series read when Prometheus scrapes (warm-up tasks, engine states, build facts, the recompile alarm, the queue)."""
