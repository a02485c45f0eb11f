"""Health, readiness and metrics routes on Gradio's FastAPI app.

``probe_routes`` gives ``GET /healthz``, ``/readyz`` (``?shape=LABEL`` for one shape: ``shape_answer``) and
``/metrics``, handed to FastAPI as a plug-in's routes (``launch(app_kwargs={"routes": ...})``) so they answer from
the first request. They check no login: with ``--auth`` the login plug-in's middleware asks for one on
``/metrics``; the probes stay open. What each answers: docs/api.md.
"""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from neuron_backend.messages import shown_value
from neuron_backend.metrics import CONTENT_TYPE
from neuron_backend.runtime import ENGINES, Backend


def probe_routes(backend: Backend) -> list[Route]:
    """The /healthz, /readyz and /metrics routes of ``backend``."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        query = request.query_params
        if "shape" in query or "engine" in query:
            # A query string reads "+" as a space and no label holds one: "?shape=1024x1024+1ref" works unencoded.
            label = query.get("shape")
            label = None if label is None else label.replace(" ", "+")
            return shape_answer(backend.shape_readiness(), label, query.get("engine"))
        ready, body = backend.readiness()
        return JSONResponse(body, status_code=200 if ready else 503)

    def metrics(request: Request) -> Response:  # sync: Starlette runs it on a worker thread
        return Response(backend.metrics.exposition(), media_type=CONTENT_TYPE)

    return [Route("/healthz", healthz, methods=["GET", "HEAD"]), Route("/readyz", readyz, methods=["GET", "HEAD"]),
            Route("/metrics", metrics, methods=["GET"])]


def shape_answer(shapes: dict[str, dict[str, dict]], label: str | None, engine: str | None) -> JSONResponse:
    """/readyz for the shape ``label`` (``engine``: whose, when given); ``shapes``: ``Backend.shape_readiness()``.

    200 when it serves here, 503 while it is queued or compiling (with its ETA) or when it failed; 404 when
    this server does not declare it (the message lists what it declares), 400 when ``engine`` names no
    known engine, comes without ``label``, or is needed because both engines declare ``label``. The messages are English
    only, as the rest of /readyz's body (a probe's answer: the page never shows it).
    """
    declared = {name: list(served) for name, served in shapes.items()}
    if engine is not None and engine not in ENGINES:
        return _refusal(400, f"unknown engine {shown_value(engine)}; allowed: "
                             f"{' or '.join(f'engine={name}' for name in ENGINES)}.", declared)
    if label is None:
        return _refusal(400, "engine= needs shape=: ask /readyz?shape=<label>&engine=<engine> for one shape, "
                             "or plain /readyz for every shape.", declared)
    if engine is not None and engine not in shapes:
        return _refusal(404, f"the {engine} engine is not enabled on this server (--no-{engine}); enabled "
                             f"engines: {', '.join(shapes) or 'none'}.", declared)
    owners = [name for name, served in shapes.items() if label in served and engine in (None, name)]
    if not owners:
        if engine is None:
            where, listed = "on this server", "; ".join(f"{name}: {', '.join(served)}" for name, served in
                                                        declared.items())
        else:
            where, listed = f"by the {engine} engine on this server", ", ".join(declared[engine])
        return _refusal(404, f"shape {shown_value(label)} is not declared {where}; declared shapes: "
                             f"{listed or 'none'}.", declared)
    if len(owners) > 1:
        return _refusal(400, f"shape {shown_value(label)} is declared by both the {owners[0]} and the "
                             f"{owners[1]} engine: add engine={owners[0]} or engine={owners[1]}.", declared)
    entry = shapes[owners[0]][label]
    ready = entry["state"] == "ready"
    eta = entry.get("eta_s")  # a router may come back then (as /v1's 503s say)
    wait = {"Retry-After": str(max(1, math.ceil(eta)))} if not ready and eta is not None else None
    return JSONResponse({"ready": ready, "engine": owners[0], "shape": label, **entry},
                        status_code=200 if ready else 503, headers=wait)


def _refusal(status: int, detail: str, declared: dict[str, list[str]]) -> JSONResponse:
    """A /readyz query that names no single declared shape: ``detail`` says what is allowed, ``declared``
    lists each enabled engine's shape labels."""
    return JSONResponse({"ready": False, "detail": detail, "declared": declared}, status_code=status)
