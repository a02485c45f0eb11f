"""deploy/: the Kubernetes manifests are valid Kubernetes and agree with the app they start.

Every manifest is read with PyYAML. Each built-in kind is validated by kubernetes-validate against
``KUBERNETES_VERSION`` in strict mode (an unknown field fails); the KEDA ScaledObject, a custom resource the
validator has no schema for, is checked by hand for the fields KEDA requires. Then against the app itself:
every app container's args and SHOWCASE_* env parse with ``parse_settings`` and its engines fit the
NeuronCores it asks for; every probe path is a route of ``tools/probes/routes.py`` on the container's ``--port``;
Services reach their pods' ports; the page's ``--chat-server`` names the chat Service; the UI tier's
``--image-server`` names each pod of the image-worker StatefulSet through its headless Service; the KEDA query reads
a metric the app exports; the budgets cover the app's compile times; the compile cache lands on the shared
volume with its lock files on local disk, as ``compile_cache.py`` decides from the pod's mounts.

Each check returns the problems it finds. The real manifests give none; ``test_each_check_catches_its_break``
breaks a copy of them one way per check and expects that check to say so.

Budgets chosen: the app serves /healthz before its warm-up, so its startup probe waits for the process only
(docs/api.md's 10 minutes) and nothing that restarts a pod waits on a compile. Readiness never restarts a pod;
what gives up on a warming pod is the Deployment's progressDeadlineSeconds (the rollout is reported failed),
so it must cover the startup budget plus the app's own first-run estimate for that pod's shapes on one
NeuronCore (``warmup.py``'s compile plan), and at least one graph's ``--compile-timeout-min``. vLLM answers HTTP only
after its compile, so its startup probe must cover its compile timeout plus ten minutes for weights and load.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import kubernetes_validate
import pytest
from support.manifests import (
    APP_CONTAINER,
    DEPLOY,
    IMAGES,
    app_containers,
    chat_server_of,
    chat_services,
    container_port,
    containers,
    dockerfile_of,
    documented_probes,
    exported_metric_names,
    first_run_estimate,
    flag,
    is_image,
    load_manifests,
    local_engines,
    neuroncores,
    of_kind,
    probe_routes,
    secret_ref,
    selected,
    settings_of,
    startup_budget,
    workers_of,
)

from neuron_backend.compile_cache import NEFF_LOCKS_ENV, configure_compile_cache, filesystem_type
from neuron_backend.errors import ShowcaseError
from tools.remote.plugin import servers

# The oldest Kubernetes in EKS standard support in December 2026 (1.34's ended on 2 Dec 2026).
KUBERNETES_VERSION = "1.35"
VLLM_COMPILE_TIMEOUT_S = 600  # vLLM Neuron's documented default VLLM_NEURON_COMPILATION_TIMEOUT
VLLM_LOAD_S = 600  # weights and load before and after vLLM's compile
# KEDA's ScaledObject (keda.sh/v1alpha1): the fields of its spec and of a trigger, and what each requires.
KEDA_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
             "minReplicaCount", "maxReplicaCount", "advanced", "triggers", "fallback"}
KEDA_TRIGGER = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
KEDA_PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}


# ----- the checks: each returns its problems ----------------------------------------------------------------
def schema_problems(docs: list[dict], report: list[str] | None = None) -> list[str]:
    """Built-in kinds against Kubernetes' schema (strict), the ScaledObject by hand."""
    problems = []
    for doc in docs:
        data = {k: v for k, v in doc.items() if k != "_file"}
        where = f"{doc['_file']}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") == "ScaledObject":
            problems += [f"{where}: {p}" for p in scaled_object_problems(data)]
            continue
        try:
            version = kubernetes_validate.validate(data, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(f"{where}: {e.message}")
        else:
            if report is not None:
                report.append(f"{where} passed against Kubernetes {version} (strict)")
    return problems


def scaled_object_problems(data: dict) -> list[str]:
    problems = []
    if data.get("apiVersion") != "keda.sh/v1alpha1":
        problems.append(f"apiVersion {data.get('apiVersion')!r} is not keda.sh/v1alpha1")
    if not data.get("metadata", {}).get("name"):
        problems.append("metadata.name is missing")
    spec = data.get("spec") or {}
    problems += [f"spec.{key} is not a field of a ScaledObject" for key in sorted(set(spec) - KEDA_SPEC)]
    if not (spec.get("scaleTargetRef") or {}).get("name"):
        problems.append("spec.scaleTargetRef.name is required")
    if not spec.get("triggers"):
        problems.append("spec.triggers is required (one trigger or more)")
    for i, trigger in enumerate(spec.get("triggers") or []):
        problems += [f"triggers[{i}].{key} is not a field of a trigger" for key in sorted(set(trigger) - KEDA_TRIGGER)]
        if not trigger.get("type") or not isinstance(trigger.get("metadata"), dict):
            problems.append(f"triggers[{i}] needs type and metadata")
        elif trigger["type"] == "prometheus":
            missing = KEDA_PROMETHEUS_REQUIRED - set(trigger["metadata"])
            problems += [f"triggers[{i}].metadata.{key} is required" for key in sorted(missing)]
            problems += [f"triggers[{i}].metadata.{k} must be a string" for k, v in trigger["metadata"].items()
                         if not isinstance(v, str)]
    for key in ("minReplicaCount", "maxReplicaCount"):
        if not isinstance(spec.get(key, 0), int):
            problems.append(f"spec.{key} must be an integer")
    return problems


def settings_problems(docs: list[dict]) -> list[str]:
    """Each app container's flags parse (with and without the optional bundle), bind 0.0.0.0, leave the image's
    ENTRYPOINT (python app.py) alone, and place every local engine on the one NeuronCore the pod asks for; a pod
    whose engines are all remote (the UI tier) asks for none and runs the CPU image."""
    problems = []
    found = app_containers(docs)
    if len(found) < 2:
        problems.append(f"expected the chat worker and the page tier as {APP_CONTAINER!r} containers, found "
                        f"{len(found)}")
    for dep, c in found:
        where = f"{dep['_file']}: {dep['metadata']['name']}"
        try:
            settings_of(c, optional_present=True)  # with the optional ConfigMap's bundle and its sha256
            settings = settings_of(c)  # and without it
        except ShowcaseError as e:
            problems.append(f"{where}: the app refuses its settings: {e}")
            continue
        if settings.models_requested != "full":
            problems.append(f"{where}: --models {settings.models_requested}: a pod that cannot reach the Hub would "
                            "serve the demo models' noise; ask for --models full")
        if settings.host != "0.0.0.0":
            problems.append(f"{where}: binds {settings.host}, not 0.0.0.0: nothing outside the pod reaches it")
        if "command" in c:
            problems.append(f"{where}: command replaces the image's ENTRYPOINT (python app.py); give args only")
        try:
            local = local_engines(settings, neuroncores(c))
        except ShowcaseError as e:
            problems.append(f"{where}: its engines do not fit its {neuroncores(c)} NeuronCore(s): {e}")
            continue
        if neuroncores(c) != (1 if local else 0):
            problems.append(f"{where}: asks for {neuroncores(c)} NeuronCores for its local engines {local}: the "
                            "topology holds one per pod that runs an engine, none for the UI tier")
        wanted = "Dockerfile" if local else "Dockerfile.ui"
        if dockerfile_of(c).name != wanted:
            problems.append(f"{where}: runs {c['image']}, not the image of deploy/{wanted} "
                            f"({'the Neuron SDK' if local else 'CPU only: every engine is remote'})")
    for name in IMAGES.values():
        entry = re.findall(r"^ENTRYPOINT (.+)$", (DEPLOY / name).read_text(), re.M)
        if entry != ['["python", "app.py"]']:
            problems.append(f"deploy/{name}'s ENTRYPOINT is {entry}, not python app.py")
    return problems


def ui_image_problems(dockerfile: Path = DEPLOY / "Dockerfile.ui") -> list[str]:
    """The UI tier's image: the Python the suite runs on, the pinned torch as its CPU build, requirements.txt, and
    nothing of the Neuron SDK."""
    problems, text = [], dockerfile.read_text(encoding="utf-8")
    base = re.search(r"^ARG BASE=python:(\d+\.\d+)", text, re.M)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not base or base.group(1) != here:
        problems.append(f"{dockerfile.name}: its base is not python:{here} (the Python the tests run on)")
    pinned = re.search(r"^torch==(\S+)", (DEPLOY.parent / "requirements.txt").read_text(), re.M).group(1)
    run = " ".join(re.findall(r"^RUN (.+)$", text.replace("\\\n", " "), re.M))  # continuation lines joined
    if "download.pytorch.org/whl/cpu" not in run or f"torch=={pinned}" not in run:
        problems.append(f"{dockerfile.name}: does not install torch=={pinned} from PyTorch's CPU index")
    if "-r requirements.txt" not in run:
        problems.append(f"{dockerfile.name}: does not install requirements.txt")
    if "neuron" in run.lower():
        problems.append(f"{dockerfile.name}: installs Neuron packages the UI tier never uses")
    return problems


def neuron_image_problems(dockerfile: Path = DEPLOY / "Dockerfile") -> list[str]:
    """The app's trn2 image: its venv sees no PYTHONPATH or user site-packages of the base image (whose vLLM
    brings a torch of its own), and its build checks that the venv's torch is the pinned one, in the venv."""
    problems, text = [], dockerfile.read_text(encoding="utf-8").replace("\\\n", "")
    lines = text.splitlines()
    env = next((i for i, line in enumerate(lines) if re.match(r"ENV .*\bPYTHONPATH=(\s|$)", line)), None)
    venv = next((i for i, line in enumerate(lines) if line.startswith("RUN python3 -m venv")), None)
    if env is None or venv is None or env > venv:
        problems.append(f"{dockerfile.name}: PYTHONPATH is not cleared before the venv is made")
    if not re.search(r"^ENV .*\bPYTHONNOUSERSITE=1\b", text, re.M):
        problems.append(f"{dockerfile.name}: user site-packages are not off (PYTHONNOUSERSITE=1)")
    if not re.search(r"^COPY requirements\.in requirements-neuron\.txt", text, re.M):
        problems.append(f"{dockerfile.name}: does not copy requirements.in beside requirements-neuron.txt")
    if torch_check(dockerfile) is None:
        problems.append(f"{dockerfile.name}: the build does not check the venv's torch against the pin")
    return problems


def torch_check(dockerfile: Path = DEPLOY / "Dockerfile") -> str | None:
    """The Python the image's build runs with its venv's python to check its torch, or None."""
    text = dockerfile.read_text(encoding="utf-8").replace("\\\n", "")
    found = re.search(r'/opt/showcase/bin/python -c "([^"]*torch[^"]*)"', text)
    return found.group(1) if found else None


def probe_problems(docs: list[dict]) -> list[str]:
    """App probes: startup and liveness on /healthz, readiness on /readyz, routes the app serves, on its --port,
    at least as tolerant as docs/api.md's; the scrape annotations name its port and /metrics. vLLM's probes
    sit on its --port."""
    problems = []
    routes, documented = probe_routes(), documented_probes()
    wanted = {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    for dep, c in app_containers(docs):
        where = f"{dep['_file']}: {dep['metadata']['name']}"
        try:
            port = settings_of(c).port
        except ShowcaseError:
            continue  # settings_problems says why
        if container_port(c, port) != port:
            problems.append(f"{where}: no containerPort {port} (the app's --port)")
        for kind, path in wanted.items():
            probe = c.get(kind)
            if not probe:
                problems.append(f"{where}: no {kind}")
                continue
            get = probe.get("httpGet", {})
            if get.get("path") not in routes or "GET" not in routes.get(get.get("path"), ()):
                problems.append(f"{where}: {kind} asks {get.get('path')!r}, not a route the app serves "
                                f"({', '.join(sorted(routes))})")
            elif get["path"] != path:
                problems.append(f"{where}: {kind} asks {get['path']}, should ask {path}")
            if container_port(c, get.get("port")) != port:
                problems.append(f"{where}: {kind} asks port {get.get('port')!r}, the app listens on {port}")
            doc = documented[kind]
            if probe.get("timeoutSeconds", 1) < doc["timeoutSeconds"] or \
                    probe.get("failureThreshold", 3) < doc["failureThreshold"] or \
                    probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3) < \
                    doc["periodSeconds"] * doc["failureThreshold"]:
                problems.append(f"{where}: {kind} is less tolerant than docs/api.md's")
        notes = dep["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/port" in notes and int(notes["prometheus.io/port"]) != port:
            problems.append(f"{where}: prometheus.io/port {notes['prometheus.io/port']} is not the app's {port}")
        if "prometheus.io/path" in notes and notes["prometheus.io/path"] not in routes:
            problems.append(f"{where}: prometheus.io/path {notes['prometheus.io/path']} is not a route of the app")
    for dep, c in containers(docs):
        if c["name"] == APP_CONTAINER:
            continue
        port = int(flag(c.get("command", []) + c.get("args", []), "--port") or 0)
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if container_port(c, c.get(kind, {}).get("httpGet", {}).get("port")) != port:
                problems.append(f"{dep['_file']}: {c['name']} {kind} is not on its --port {port}")
    return problems


def service_problems(docs: list[dict]) -> list[str]:
    """Every Service selects pods and reaches a port they listen on; the page's is sticky per client."""
    problems = []
    for svc in of_kind(docs, "Service"):
        where = f"{svc['_file']}: Service/{svc['metadata']['name']}"
        pods = selected(docs, svc)
        if not pods:
            problems.append(f"{where}: selects no pod of its file")
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            problems += [f"{where}: targetPort {target!r} is no port of {c['name']}" for _, c in pods
                         if container_port(c, target) is None]
    pages = [dep for dep, c in app_containers(docs) if chat_server_of(c)]
    for svc in of_kind(docs, "Service"):
        if any(dep in pages for dep, _ in selected(docs, svc)) and svc["spec"].get("sessionAffinity") != "ClientIP":
            problems.append(f"{svc['_file']}: Service/{svc['metadata']['name']} needs sessionAffinity: ClientIP "
                            "(Gradio's sessions live in one process)")
    if not pages:
        problems.append("no page tier (an app container with --chat-server)")
    return problems


def chat_link_problems(docs: list[dict]) -> list[str]:
    """The page's --chat-server is http://<chat Service>:<its port>/v1 for each chat alternative, and the page
    sends the key the chat server asks for (the same Secret and key)."""
    problems = []
    services = chat_services(docs)
    if not services:
        problems.append("no Service in front of a chat server")
    keys = {}
    for dep, c in containers(docs):
        variable = "VLLM_API_KEY" if c["name"] == "vllm" else "SHOWCASE_API_KEY"
        if dep["_file"] in {s["_file"] for s in services}:
            keys[dep["_file"]] = secret_ref(c, variable)
    for dep, c in app_containers(docs):
        url = chat_server_of(c)
        if not url:
            continue
        parts = urllib.parse.urlsplit(url)
        for svc in services:
            where = f"{dep['_file']}: --chat-server {url} for {svc['_file']}"
            if (parts.hostname or "").split(".")[0] != svc["metadata"]["name"]:
                problems.append(f"{where}: the host is not the Service {svc['metadata']['name']}")
            if parts.port not in [p["port"] for p in svc["spec"]["ports"]]:
                problems.append(f"{where}: port {parts.port} is not the Service's port")
            if parts.path != "/v1":
                problems.append(f"{where}: the path is {parts.path!r}, the OpenAI base URL ends in /v1")
            wanted, sent = keys.get(svc["_file"]), secret_ref(c, "SHOWCASE_CHAT_SERVER_KEY")
            if wanted != sent:
                problems.append(f"{where}: the chat server asks for the key {wanted}, the page sends {sent}")
    return problems


def worker_link_problems(docs: list[dict]) -> list[str]:
    """Each URL of a page's --image-server is one pod of an image-worker StatefulSet, http://<set>-<n>.<its
    headless Service>:<port>, with n below its replicas and the port the worker's --port; every worker is named
    (the page routes only to those); the workers start in parallel and resolve while they warm up; each declares
    the page's sizes, references and steps (the page checks a request against its own flags)."""
    problems = []
    sets = {s["metadata"]["name"]: s for s in of_kind(docs, "StatefulSet")}
    services = {s["metadata"]["name"]: s for s in of_kind(docs, "Service")}
    for dep, c in app_containers(docs):
        try:
            page = settings_of(c)
        except ShowcaseError:
            continue  # settings_problems says why
        if not servers(page).images:
            continue
        named: dict[str, set[int]] = {}
        for url in servers(page).images:
            where = f"{dep['_file']}: --image-server {url}"
            parts = urllib.parse.urlsplit(url)
            pod, _, service = (parts.hostname or "").partition(".")
            name, _, ordinal = pod.rpartition("-")
            workers = sets.get(name)
            if workers is None or not ordinal.isdigit():
                problems.append(f"{where}: {pod!r} is no pod of an image-worker StatefulSet of deploy/")
                continue
            named.setdefault(name, set()).add(int(ordinal))
            spec, svc = workers["spec"], services.get(service.split(".")[0])
            if int(ordinal) >= spec.get("replicas", 1):
                problems.append(f"{where}: {name} has {spec.get('replicas', 1)} replicas, no pod {pod}")
            if svc is None or spec["serviceName"] != svc["metadata"]["name"]:
                problems.append(f"{where}: {service!r} is not {name}'s serviceName {spec['serviceName']!r}")
                continue
            if svc["spec"].get("clusterIP") != "None":
                problems.append(f"{where}: Service/{service} is not headless (clusterIP: None): no name per pod")
            if svc["spec"].get("publishNotReadyAddresses") is not True:
                problems.append(f"{where}: Service/{service} lacks publishNotReadyAddresses: a warming worker's "
                                "name would not resolve, and the page could not show its warm-up")
            worker = next(wc for wd, wc in containers(docs) if wd is workers and wc["name"] == APP_CONTAINER)
            port = next((p for p in svc["spec"]["ports"] if p["port"] == parts.port), None)
            if port is None or container_port(worker, port.get("targetPort", port["port"])) != \
                    settings_of(worker).port:
                problems.append(f"{where}: port {parts.port} does not reach the worker's --port")
            theirs = settings_of(worker)
            if theirs.chat or not theirs.image:
                problems.append(f"{where}: the worker is not started with --no-chat")
            for what in ("sizes", "references", "max_steps", "max_images_per_run"):
                if getattr(theirs, what) != getattr(page, what):
                    problems.append(f"{where}: the worker's {what} {getattr(theirs, what)} are not the page's "
                                    f"{getattr(page, what)}")
        for name, ordinals in named.items():
            spec = sets[name]["spec"]
            unnamed = sorted(set(range(spec.get("replicas", 1))) - ordinals)
            problems += [f"{dep['_file']}: {name}-{n} gets no image: --image-server does not name it" for n in unnamed]
            if spec.get("podManagementPolicy") != "Parallel":
                problems.append(f"{sets[name]['_file']}: {name} starts its workers one after another "
                                "(podManagementPolicy: Parallel starts every worker's compile at once)")
    return problems


VLLM_MIN_BUCKET = 128  # vLLM Neuron's documented default prefill buckets: powers of 2 from 128


def vllm_shape_problems(docs: list[dict]) -> list[str]:
    """vLLM compiles the app's shapes as its docs allow: --max-model-len is the app's context; neuron_config's
    prefill buckets are at least 128 tokens, hold the app's largest prompt bucket, and the largest equals
    --max-num-batched-tokens (as vLLM Neuron requires); its decode batch buckets end at --max-num-seqs; its
    precompile cache is on (VLLM_NEURON_BACKEND=neuron_native, VLLM_CACHE_ROOT on a persistent claim)."""
    problems = []
    workers = [c for _, c in app_containers(docs) if not is_image(c)]
    app = settings_of(workers[0]) if workers else None
    for dep, c in containers(docs):
        if c["name"] != "vllm" or app is None:
            continue
        command, where = c.get("command", []) + c.get("args", []), f"{dep['_file']}: vllm serve"
        config = json.loads(flag(command, "--additional-config") or "{}").get("neuron_config", {})
        buckets, seqs = config.get("num_batched_tokens_buckets") or [], config.get("num_seqs_buckets") or []
        if int(flag(command, "--max-model-len") or 0) != app.context_length:
            problems.append(f"{where}: --max-model-len {flag(command, '--max-model-len')} is not the app's context "
                            f"{app.context_length}")
        if not buckets or min(buckets) < VLLM_MIN_BUCKET:
            problems.append(f"{where}: num_batched_tokens_buckets {buckets} go below {VLLM_MIN_BUCKET} tokens, vLLM "
                            "Neuron's documented smallest")
        elif max(buckets) < max(app.buckets):
            problems.append(f"{where}: num_batched_tokens_buckets {buckets} do not hold the app's largest bucket "
                            f"{max(app.buckets)}")
        elif int(flag(command, "--max-num-batched-tokens") or 0) != max(buckets):
            problems.append(f"{where}: --max-num-batched-tokens is not the largest bucket {max(buckets)}")
        if not seqs or max(seqs) != int(flag(command, "--max-num-seqs") or 0):
            problems.append(f"{where}: num_seqs_buckets {seqs} do not end at --max-num-seqs")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if env.get("VLLM_NEURON_BACKEND") != "neuron_native":
            problems.append(f"{where}: VLLM_NEURON_BACKEND is not neuron_native: its precompile cache is off")
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
        mounted = [m for m in c.get("volumeMounts", []) if env.get("VLLM_CACHE_ROOT")
                   and (env["VLLM_CACHE_ROOT"] + "/").startswith(m["mountPath"].rstrip("/") + "/")]
        if not mounted or "persistentVolumeClaim" not in volumes.get(mounted[-1]["name"], {}):
            problems.append(f"{where}: VLLM_CACHE_ROOT {env.get('VLLM_CACHE_ROOT')} is not on a persistent claim: "
                            "every start recompiles")
    return problems


def scaler_problems(docs: list[dict]) -> list[str]:
    """KEDA scales the page Deployment on metrics the app exports, before a replica's queue is full."""
    problems = []
    exported = exported_metric_names()
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    scalers = of_kind(docs, "ScaledObject")
    if not scalers:
        problems.append("no ScaledObject")
    for so in scalers:
        spec, where = so["spec"], f"{so['_file']}: ScaledObject/{so['metadata']['name']}"
        target = deployments.get(spec["scaleTargetRef"]["name"])
        if target is None:
            problems.append(f"{where}: scales {spec['scaleTargetRef']['name']!r}, no Deployment of deploy/")
            continue
        app = [c for c in target["spec"]["template"]["spec"]["containers"] if c["name"] == APP_CONTAINER]
        if spec.get("minReplicaCount", 0) < 1:
            problems.append(f"{where}: scales to zero: the next visitor would wait for a warm-up")
        for trigger in spec["triggers"]:
            query = trigger["metadata"].get("query", "")
            names = set(re.findall(r"\b(showcase_[a-z0-9_]+)\b", query))
            if not names:
                problems.append(f"{where}: the query {query!r} reads none of the app's metrics")
            problems += [f"{where}: {name} is not a metric the app exports" for name in sorted(names - exported)]
            threshold = float(trigger["metadata"].get("threshold", "inf"))
            if app and "showcase_queue_depth" in names and threshold >= settings_of(app[0]).queue_size:
                problems.append(f"{where}: threshold {threshold:g} waiting requests per replica is not below the "
                                f"page's --queue-size {settings_of(app[0]).queue_size}, past which it refuses")
    return problems


def budget_problems(docs: list[dict]) -> list[str]:
    """Nothing gives up on a pod while it may still be compiling within the app's limits (see the docstring)."""
    problems = []
    for dep, c in app_containers(docs):
        where = f"{dep['_file']}: {dep['metadata']['name']}"
        try:
            settings = settings_of(c)
            estimate = first_run_estimate(settings, neuroncores(c))
        except ShowcaseError:
            continue  # settings_problems says why
        if dep["kind"] != "Deployment":
            continue  # a StatefulSet has no rollout deadline: its pods only ever wait
        deadline = dep["spec"].get("progressDeadlineSeconds", 600)
        needed = max(startup_budget(c) + estimate, settings.compile_timeout_min * 60)
        if deadline < needed:
            problems.append(f"{where}: progressDeadlineSeconds {deadline} < {needed:.0f} s (startup "
                            f"{startup_budget(c)} s + the app's first-run estimate {estimate:.0f} s, or one "
                            f"graph's --compile-timeout-min)")
        workers = workers_of(docs, settings)  # the page turns ready once a worker serves every size
        slowest = max((first_run_estimate(settings_of(w), neuroncores(w)) for w in workers), default=0.0)
        if workers and deadline < startup_budget(c) + slowest:
            problems.append(f"{where}: progressDeadlineSeconds {deadline} < {startup_budget(c) + slowest:.0f} s "
                            f"(startup + the workers' first-run estimate {slowest:.0f} s)")
    for dep, c in containers(docs):
        if c["name"] != "vllm":
            continue
        timeout = next((int(e["value"]) for e in c.get("env", []) if e["name"] == "VLLM_NEURON_COMPILATION_TIMEOUT"),
                       VLLM_COMPILE_TIMEOUT_S)
        if startup_budget(c) < timeout + VLLM_LOAD_S:
            problems.append(f"{dep['_file']}: vLLM's startup probe gives {startup_budget(c)} s, its compile alone "
                            f"may take {timeout} s")
        if dep["spec"].get("progressDeadlineSeconds", 600) < startup_budget(c):
            problems.append(f"{dep['_file']}: progressDeadlineSeconds is shorter than vLLM's startup budget")
    return problems


def cache_problems(docs: list[dict], scratch: Path) -> list[str]:
    """Where the app puts its compile cache and lock files given the pod's mounts (a claim: a network filesystem,
    lustre for FSx; an emptyDir: the node's disk): the cache on a shared claim that allows several pods, the locks
    and the rest of the cache root on local disk (docs/trainium.md)."""
    problems = []
    claims = {c["metadata"]["name"]: c for c in of_kind(docs, "PersistentVolumeClaim")}
    for dep, c in app_containers(docs):
        where = f"{dep['_file']}: {dep['metadata']['name']}"
        try:
            root = settings_of(c).cache_dir
        except ShowcaseError:
            continue
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
        lines, here = ["overlay / overlay rw 0 0"], scratch / dep["metadata"]["name"]
        for mount in c.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            kind = "lustre" if "persistentVolumeClaim" in volume else "ext4"
            lines.append(f"{mount['name']} {here}{mount['mountPath']} {kind} rw 0 0")
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim and "ReadWriteMany" not in claims.get(claim, {}).get("spec", {}).get("accessModes", []):
                problems.append(f"{where}: claim {claim} is not a ReadWriteMany claim of deploy/")
        mounts, env = "\n".join(lines) + "\n", {"HOME": str(here / "root")}
        setup = configure_compile_cache(Path(f"{here}{root}"), env, mounts)
        if filesystem_type(Path(f"{here}{root}"), mounts) == "overlay":
            problems.append(f"{where}: the cache root {root} is in the container's writable layer, not a volume")
        if not local_engines(settings_of(c), neuroncores(c)):
            continue  # every engine remote: nothing compiles here
        if setup.folder is None or filesystem_type(setup.folder, mounts) != "lustre":
            problems.append(f"{where}: the compile cache {root}/compile-cache is not on the shared claim")
        if filesystem_type(Path(env[NEFF_LOCKS_ENV]), mounts) == "lustre":
            problems.append(f"{where}: the NEFF lock files land on the network filesystem")
    return problems


CHECKS = (schema_problems, settings_problems, probe_problems, service_problems, chat_link_problems,
          worker_link_problems, vllm_shape_problems, scaler_problems, budget_problems)


# ----- the tests ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def docs():
    return load_manifests()


def test_every_file_holds_what_the_topology_needs(docs):
    files = {d["_file"]: d["kind"] for d in docs}
    assert {"chat-worker.yaml", "vllm-chat.yaml", "page.yaml", "page-ui.yaml", "image-workers.yaml",
            "page-scaler.yaml", "compile-cache.yaml"} <= set(files)
    assert sorted({d["kind"] for d in docs}) == ["Deployment", "PersistentVolumeClaim", "ScaledObject", "Service",
                                                 "StatefulSet"]


def test_the_manifests_are_valid_kubernetes(docs):
    report = []
    problems = schema_problems(docs, report)
    assert not problems, "\n".join(problems)
    assert len(report) == len(docs) - len(of_kind(docs, "ScaledObject")) >= 6


@pytest.mark.parametrize("check", CHECKS[1:], ids=lambda check: check.__name__)
def test_the_manifests_agree_with_the_app(docs, check):
    problems = check(docs)
    assert not problems, "\n".join(problems)


def test_the_ui_tier_image_is_cpu_only(tmp_path):
    assert not ui_image_problems()
    broken = tmp_path / "Dockerfile.ui"  # and the check sees the Neuron SDK's image line in it
    text = (DEPLOY / "Dockerfile.ui").read_text().replace("-r requirements.txt", "-r requirements-neuron.txt")
    broken.write_text(text.replace("--index-url https://download.pytorch.org/whl/cpu ", ""))
    assert ui_image_problems(broken) == [
        "Dockerfile.ui: does not install torch==2.13.0 from PyTorch's CPU index",
        "Dockerfile.ui: does not install requirements.txt", "Dockerfile.ui: installs Neuron packages the UI tier "
        "never uses"]


def test_the_trainium_image_keeps_the_base_images_torch_out_of_its_venv(tmp_path):
    assert neuron_image_problems() == []
    broken = tmp_path / "Dockerfile"
    text = (DEPLOY / "Dockerfile").read_text()
    broken.write_text(text.replace("ENV PYTHONPATH= PYTHONNOUSERSITE=1\n", ""))
    assert neuron_image_problems(broken) == ["Dockerfile: PYTHONPATH is not cleared before the venv is made",
                                             "Dockerfile: user site-packages are not off (PYTHONNOUSERSITE=1)"]
    # the build's check, run by this suite's venv python (the pinned torch, in this venv) from the app's folder
    check = torch_check()
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-c", check], cwd=DEPLOY.parent, env=clean, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    # another torch first on PYTHONPATH, as a base image's may be: the build stops and says so
    leak = tmp_path / "leak"
    (leak / "torch").mkdir(parents=True)
    (leak / "torch" / "__init__.py").write_text("")
    (leak / "torch-2.9.1.dist-info").mkdir()
    (leak / "torch-2.9.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1\n")
    ran = subprocess.run([sys.executable, "-c", check], cwd=DEPLOY.parent, env={**clean, "PYTHONPATH": str(leak)},
                         capture_output=True, text=True)
    assert ran.returncode == 1 and "torch 2.9.1" in ran.stderr and "is not the pinned torch==2.13.0" in ran.stderr


def test_the_compile_cache_is_shared_and_its_locks_stay_local(docs, tmp_path):
    problems = cache_problems(docs, tmp_path)
    assert not problems, "\n".join(problems)


def _set(path: str, value):
    """A break: set the value at ``path`` ("file|kind/name|key.0.key") in a copy of the manifests."""
    def apply(docs):
        where, kind_name, keys = path.split("|")
        kind, name = kind_name.split("/")
        doc = next(d for d in docs if d["_file"] == where and d["kind"] == kind and d["metadata"]["name"] == name)
        *parents, last = [int(k) if k.isdigit() else k for k in keys.split(".")]
        for key in parents:
            doc = doc[key]
        if value is None:
            del doc[last]
        else:
            doc[last] = value
    return apply


PAGE = "page.yaml|Deployment/showcase-page|spec.template.spec.containers.0"
WORKER = "chat-worker.yaml|Deployment/showcase-chat|spec.template.spec.containers.0"
VLLM = "vllm-chat.yaml|Deployment/showcase-vllm|spec.template.spec.containers.0"
SCALER = "page-scaler.yaml|ScaledObject/showcase-page|spec"
UI = "page-ui.yaml|Deployment/showcase-page|spec.template.spec.containers.0"
IMAGE = "image-workers.yaml|StatefulSet/showcase-image|spec"
BREAKS = {
    "an unknown field": (_set(f"{PAGE}.livenesProbe", {}), schema_problems, "'livenesProbe' was unexpected"),
    "a string for a number": (_set(f"{WORKER}.startupProbe.periodSeconds", "10"), schema_problems, "not of type"),
    "a ScaledObject without triggers": (_set(f"{SCALER}.triggers", None), schema_problems, "spec.triggers"),
    "a size the app refuses": (_set(f"{PAGE}.args", [*"--models full --sizes 1000x1000 --host 0.0.0.0".split()]),
                               settings_problems, "refuses its settings"),
    "the loopback address": (_set(f"{WORKER}.args.4", "127.0.0.1"), settings_problems, "not 0.0.0.0"),
    "the demo models' fallback": (_set(f"{WORKER}.args.1", "auto"), settings_problems, "--models auto"),
    "a second core the pod lacks": (_set(f"{WORKER}.args", [*"--models full --no-image --host 0.0.0.0 "
                                                             "--device neuron:1".split()]),
                                    settings_problems, "do not fit"),
    "a wrong probe path": (_set(f"{PAGE}.readinessProbe.httpGet.path", "/ready"), probe_problems,
                           "not a route the app serves"),
    "liveness on /readyz": (_set(f"{WORKER}.livenessProbe.httpGet.path", "/readyz"), probe_problems,
                            "should ask /healthz"),
    "a probe on another port": (_set(f"{PAGE}.startupProbe.httpGet.port", 7861), probe_problems, "listens on 7860"),
    "an impatient probe": (_set(f"{PAGE}.readinessProbe.timeoutSeconds", 1), probe_problems, "less tolerant"),
    "--port unlike the containerPort": (_set(f"{PAGE}.args.7", "7861"), probe_problems, "no containerPort 7861"),
    "vLLM probed off its port": (_set(f"{VLLM}.command.12", "8001"), probe_problems, "not on its --port 8001"),
    "no session affinity": (_set("page.yaml|Service/showcase-page|spec.sessionAffinity", "None"), service_problems,
                            "sessionAffinity: ClientIP"),
    "a Service to a closed port": (_set("chat-worker.yaml|Service/showcase-chat|spec.ports.0.targetPort", 7861),
                                   service_problems, "targetPort 7861"),
    "the chat Service on another port": (_set("vllm-chat.yaml|Service/showcase-chat|spec.ports.0.port", 8080),
                                         chat_link_problems, "not the Service's port"),
    "a chat URL without /v1": (_set(f"{PAGE}.args.3", "http://showcase-chat:8000"), chat_link_problems, "/v1"),
    "a chat URL to another host": (_set(f"{PAGE}.args.3", "http://chat:8000/v1"), chat_link_problems,
                                   "not the Service showcase-chat"),
    "another key": (_set(f"{PAGE}.env.0.valueFrom.secretKeyRef.key", "token"), chat_link_problems,
                    "the page sends"),
    "a metric the app lacks": (_set(f"{SCALER}.triggers.0.metadata.query", "sum(showcase_queue_length)"),
                               scaler_problems, "not a metric the app exports"),
    "scaling after the queue is full": (_set(f"{SCALER}.triggers.0.metadata.threshold", "16"), scaler_problems,
                                        "not below the page's --queue-size 16"),
    "scaling to zero": (_set(f"{SCALER}.minReplicaCount", 0), scaler_problems, "scales to zero"),
    "a rollout deadline shorter than the warm-up": (
        _set("page.yaml|Deployment/showcase-page|spec.progressDeadlineSeconds", 3600), budget_problems,
        "first-run estimate 12000 s"),
    "vLLM's compile past its startup probe": (_set(f"{VLLM}.startupProbe.failureThreshold", 60), budget_problems,
                                              "its compile alone"),
    "a NeuronCore for the UI tier": (_set(f"{UI}.resources", {"limits": {"aws.amazon.com/neuroncore": 1}}),
                                     settings_problems, "none for the UI tier"),
    "the UI tier on the trn2 image": (_set(f"{UI}.image", "trainium-showcase:latest"), settings_problems,
                                      "not the image of deploy/Dockerfile.ui"),
    "a worker the page does not name": (_set(f"{IMAGE}.replicas", 3), worker_link_problems,
                                        "showcase-image-2 gets no image"),
    "a worker past the replicas": (_set(f"{IMAGE}.replicas", 1), worker_link_problems, "no pod showcase-image-1"),
    "a worker URL to another pod": (_set(f"{UI}.args.5", "http://showcase-img-0.showcase-image:7860"),
                                    worker_link_problems, "is no pod of an image-worker StatefulSet"),
    "workers started one by one": (_set(f"{IMAGE}.podManagementPolicy", "OrderedReady"), worker_link_problems,
                                   "podManagementPolicy: Parallel"),
    "a worker Service with a virtual IP": (_set("image-workers.yaml|Service/showcase-image|spec.clusterIP", None),
                                           worker_link_problems, "not headless"),
    "warming workers unnamed": (_set("image-workers.yaml|Service/showcase-image|spec.publishNotReadyAddresses",
                                     False), worker_link_problems, "publishNotReadyAddresses"),
    "a worker without a size of the page": (_set(f"{IMAGE}.template.spec.containers.0.args",
                                                 [*"--models full --no-chat --host 0.0.0.0 --port 7860 --cache-dir "
                                                   "/cache --sizes 1024x1024".split()]),
                                            worker_link_problems, "the worker's sizes"),
    "a worker on another port": (_set(f"{IMAGE}.template.spec.containers.0.args.6", "7861"), worker_link_problems,
                                 "does not reach the worker's --port"),
    "vLLM with another cache": (_set(f"{VLLM}.command.4", "8192"), vllm_shape_problems, "not the app's context"),
    "vLLM with a bucket below its minimum": (_set(f"{VLLM}.command.16", '{"neuron_config": {"num_batched_tokens_'
                                                 'buckets": [64, 256, 1024, 3072], "num_seqs_buckets": [1, 2, 4]}}'),
                                             vllm_shape_problems, "go below 128 tokens"),
    "vLLM's buckets short of the app's prompts": (
        _set(f"{VLLM}.command.16", '{"neuron_config": {"num_batched_tokens_buckets": [128, 1024], "num_seqs_buckets":'
                                   ' [1, 2, 4]}}'), vllm_shape_problems, "do not hold the app's largest bucket 3072"),
    "vLLM's token budget past its buckets": (_set(f"{VLLM}.command.14", "4096"), vllm_shape_problems,
                                             "not the largest bucket 3072"),
    "vLLM on its default backend": (_set(f"{VLLM}.env.2.value", "neuron"), vllm_shape_problems,
                                    "VLLM_NEURON_BACKEND is not neuron_native"),
    "vLLM's cache on the pod's own disk": (_set(f"{VLLM}.volumeMounts.2.name", "models"), vllm_shape_problems,
                                           "not on a persistent claim"),
    "a UI rollout deadline shorter than the workers' warm-up": (
        _set("page-ui.yaml|Deployment/showcase-page|spec.progressDeadlineSeconds", 3600), budget_problems,
        "the workers' first-run estimate 12000 s"),
    "no shared compile cache": (_set(f"{PAGE}.volumeMounts", [{"name": "cache-root", "mountPath": "/cache"}]),
                                cache_problems, "not on the shared claim"),
    "a claim for one pod": (_set("compile-cache.yaml|PersistentVolumeClaim/showcase-compile-cache|spec.accessModes",
                                 ["ReadWriteOnce"]), cache_problems, "not a ReadWriteMany claim"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_each_check_catches_its_break(docs, tmp_path, name):
    """A test that cannot fail proves nothing: each break, on a copy, makes its check name the problem."""
    apply_break, check, expected = BREAKS[name]
    broken = copy.deepcopy(docs)
    apply_break(broken)
    problems = check(broken, tmp_path) if check is cache_problems else check(broken)
    assert any(expected in p for p in problems), problems
