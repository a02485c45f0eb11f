"""deploy/ read as the app reads its flags: the manifests' documents, their app containers' Settings, the routes
and metrics the app serves, and its own first-run compile estimate. The checks live in tests/tools/test_deploy.py."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import yaml

from app import PLUGINS
from neuron_backend import warmup
from neuron_backend.devices import HostDevices, resolve_placements
from neuron_backend.errors import ShowcaseError
from neuron_backend.metrics import Metrics
from neuron_backend.plugins import plug_all
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import shape_keys
from tools.remote import plugin as remote_engines
from tools.remote.plugin import servers

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NEURONCORE = "aws.amazon.com/neuroncore"
APP_CONTAINER = "showcase"  # the name of every container that runs this app (deploy/Dockerfile's image)
# The app's two images: trn2 (the Neuron SDK, for pods that run an engine) and CPU (the UI tier, every engine remote).
IMAGES = {"trainium-showcase": "Dockerfile", "trainium-showcase-ui": "Dockerfile.ui"}
SAMPLE_SHA256 = "ab" * 32


# ----- reading the manifests --------------------------------------------------------------------------------
def load_manifests(folder: Path = DEPLOY) -> list[dict]:
    """Every document of every deploy/*.yaml, each with ``_file`` (its file name) added."""
    docs = []
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs.append({**doc, "_file": path.name})
    return docs


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def containers(docs: list[dict]):
    """(workload, container) for every container of every Deployment and StatefulSet."""
    for dep in of_kind(docs, "Deployment") + of_kind(docs, "StatefulSet"):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            yield dep, c


def app_containers(docs: list[dict]):
    return [(dep, c) for dep, c in containers(docs) if c["name"] == APP_CONTAINER]


def env_of(container: dict, optional_present: bool) -> dict[str, str]:
    """The container's SHOWCASE_* environment: literal values, a stand-in word for a Secret's value, and the
    optional ConfigMap values either absent or present (a bundle with a sample sha256)."""
    env = {}
    for item in container.get("env", []):
        name, source = item["name"], item.get("valueFrom", {})
        if not name.startswith("SHOWCASE_"):
            continue
        if "value" in item:
            env[name] = str(item["value"])
        elif "secretKeyRef" in source:
            env[name] = "secret-{name}-{key}".format(**source["secretKeyRef"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            if optional_present or not ref.get("optional"):
                env[name] = SAMPLE_SHA256 if ref["key"] == "sha256" else "/cache/bundle.tar.gz"
    return env


def settings_of(container: dict, optional_present: bool = False):
    """The app's Settings for this container; never asks the Hub (``--models auto`` reads as unreachable)."""
    settings = parse_settings(container.get("args", []), env=env_of(container, optional_present), plugins=PLUGINS,
                              weights_available=lambda model, timeout: (False, "the manifests' test asks no Hub"))
    plug_all(PLUGINS, settings)  # the plug-ins' flags checked as app.py checks them
    return settings


def elsewhere(settings):
    """The engines this container's settings run on other servers (--chat-server, --image-server)."""
    return remote_engines.plug(settings).elsewhere


def secret_ref(container: dict, variable: str) -> tuple[str, str] | None:
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if item["name"] == variable and ref:
            return ref["name"], ref["key"]
    return None


def flag(command: list[str], name: str) -> str | None:
    """The value after ``name`` in a command line, or None."""
    return command[command.index(name) + 1] if name in command[:-1] else None


def container_port(container: dict, port) -> int | None:
    """A probe's or Service's port (a number or a port name) as this container's number, or None."""
    for p in container.get("ports", []):
        if port in (p["containerPort"], p.get("name")):
            return p["containerPort"]
    return None


def startup_budget(container: dict) -> int:
    probe = container["startupProbe"]
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def neuroncores(container: dict) -> int:
    return int(container.get("resources", {}).get("limits", {}).get(NEURONCORE, 0))


# ----- what the app says ------------------------------------------------------------------------------------
def probe_routes() -> dict[str, set[str]]:
    """Path -> methods of the routes ``tools/probes/routes.py`` adds to Gradio's app (the backend is read only per
    request)."""
    from tools.probes.routes import probe_routes as routes

    return {r.path: r.methods for r in routes(None)}


def exported_metric_names() -> set[str]:
    """Every series name /metrics exposes, as a Backend's Metrics has them once served: the probes' scrape-time
    series registered (tools/probes/collector.py) and the queue gauge set (ui.serve)."""
    from tools.probes.collector import StateCollector

    metrics = Metrics()
    metrics.registry.register(StateCollector(metrics, lambda: [], lambda: {"chat": "ready", "image": "ready"},
                                             lambda: 0, lambda: {}))
    metrics.queue_depth = lambda: 0  # ui/__init__.py: backend.metrics.queue_depth = lambda: len(demo._queue)
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


def documented_probes() -> dict[str, dict]:
    """The startup, readiness and liveness probes docs/api.md recommends."""
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    return yaml.safe_load(re.search(r"```yaml\n(startupProbe:.*?)```", page, re.S).group(1))


def first_run_estimate(settings, cores: int) -> float:
    """The app's own first-run warm-up estimate (s) for these settings on ``cores`` NeuronCores: its compile tasks
    priced as ``Backend._plan`` prices them (weights and load not included)."""
    total = 0.0
    host = HostDevices(neuron_cores=cores, cuda_devices=0)
    for engine, placement in resolve_placements(settings, host, elsewhere(settings)).items():
        if placement.kind == "remote":
            continue
        shapes = shape_keys(settings, engine)
        for i, shape in enumerate(shapes):
            plan = warmup.chat_plan(settings, placement, [s.tokens for s in shapes], i) if engine == "chat" \
                else warmup.image_plan(settings, placement, shape, i)
            total += plan.estimate_s
    return total


def local_engines(settings, cores: int) -> list[str]:
    """The engines this container runs itself (not through --chat-server or --image-server)."""
    placements = resolve_placements(settings, HostDevices(neuron_cores=max(cores, 0), cuda_devices=0),
                                    elsewhere(settings))
    return [engine for engine, placement in placements.items() if placement.kind != "remote"]


def dockerfile_of(container: dict) -> Path:
    """The Dockerfile that builds the container's image (its name without registry and tag)."""
    name = container["image"].rsplit("/", 1)[-1].split(":")[0]
    return DEPLOY / IMAGES.get(name, f"<no Dockerfile builds {name}>")


def selected(docs: list[dict], service: dict) -> list[tuple[dict, dict]]:
    """(deployment, container) of the pods a Service selects, in the Service's own file."""
    wanted = service["spec"].get("selector", {}).items()
    return [(dep, c) for dep, c in containers(docs) if dep["_file"] == service["_file"]
            and wanted <= dep["spec"]["template"]["metadata"]["labels"].items()]


def chat_server_of(container: dict) -> str | None:
    try:
        return servers(settings_of(container)).chat
    except ShowcaseError:
        return None


def chat_services(docs: list[dict]) -> list[dict]:
    """Services in front of a chat server: this app without its image engine, or vLLM."""
    out = []
    for svc in of_kind(docs, "Service"):
        for _, c in selected(docs, svc):
            if c["name"] == "vllm" or (c["name"] == APP_CONTAINER and not is_image(c)):
                out.append(svc)
                break
    return out


def is_image(container: dict) -> bool:
    try:
        return settings_of(container).image
    except ShowcaseError:
        return True


def workers_of(docs: list[dict], settings) -> list[dict]:
    """The app containers of the StatefulSets a page's --image-server names."""
    urls = servers(settings).images
    names = {(urllib.parse.urlsplit(u).hostname or "").split(".")[0].rpartition("-")[0] for u in urls}
    return [c for dep, c in app_containers(docs) if dep["kind"] == "StatefulSet" and dep["metadata"]["name"] in names]
