"""What a compile cache was built for, and whether a bundle built elsewhere fits this server.

A manifest is plain JSON: the declared shapes of each engine, the model each engine ran (its id,
the commit sha of the revision loaded, and a fingerprint of its configs and weight headers: names,
dtypes and shapes, not values, since compile keys depend on those), device kind, software versions
and compile options, and what the Neuron NEFF cache key depends on: the instance family, the
effective logical-core config (LNC), ``NEURON_COMPILER_OPT_LEVEL``, ``NEURON_CC_FLAGS`` and the
traced StableHLO, which carries absolute source locations, so the install folders of torch,
transformers, diffusers and the app. The app writes one next to its compile cache when warm-up ends
(``compile-cache/manifest.json``); an exported bundle carries it plus a sha256 per file.

``compare`` checks a bundle's manifest against this server's, field by field: a field every graph
depends on (torch, torch-neuronx, the Neuron compiler, Python, the CPU architecture) makes every
graph unusable; a field of the NEFF key makes the graphs of the bundle's Neuron engines miss (each
such field is reported as "made for X, this host has Y", and the graphs that will not hit are
named); a field of one engine (its model, dtype, device kind, compile options, cache length...)
makes that engine's graphs unusable; otherwise each shape this server declares and the bundle holds
is usable.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from neuron_backend.messages import tr
from neuron_backend.shapes import engine_name, shape_keys
from neuron_backend.weights import tensor_shapes

FORMAT = 1
# Environment the Neuron compiler reads into the NEFF cache key: recorded, never set here.
COMPILER_ENV = {"platform_target": "NEURON_PLATFORM_TARGET_OVERRIDE", "opt_level": "NEURON_COMPILER_OPT_LEVEL",
                "compiler_flags": "NEURON_CC_FLAGS"}
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
# instance types' families that compile for another's target: TorchNeuron maps trn2n and trn2u (UltraServer)
# hosts to trn2, so their NEFFs are trn2's
SAME_TARGET = {"trn2n": "trn2", "trn2u": "trn2"}
LNC_DEFAULT = {"trn2": "2"}  # the logical-core config the runtime uses when NEURON_LOGICAL_NC_CONFIG is unset
DMI_PRODUCT = Path("/sys/devices/virtual/dmi/id/product_name")  # the EC2 instance type, e.g. "trn2.48xlarge"
TRACED_PACKAGES = ("torch", "transformers", "diffusers")  # their source locations are in every traced program
GLOBAL_FIELDS = ("software.python", "software.torch", "software.torch_neuronx", "software.neuronx_cc",
                 "device.machine")
NEFF_KEY_FIELDS = ("device.platform_target", "device.instance_family", "device.logical_nc_config",
                   "device.opt_level", "device.compiler_flags", *(f"paths.{name}" for name in TRACED_PACKAGES),
                   "paths.app")
ENGINE_FIELDS = {
    "chat": ("model", "fingerprint", "kind", "dtype", "compile", "backend", "fullgraph", "dynamic", "library",
             "context_length", "cache_windows", "batch", "prefill_chunk"),
    "image": ("model", "fingerprint", "kind", "dtype", "compile", "backend", "fullgraph", "dynamic", "library",
              "repeated_blocks"),
}


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def software() -> dict[str, str | None]:
    """Versions every compile key depends on, and the libraries that trace the models."""
    import torch

    return {"python": ".".join(platform.python_version_tuple()[:2]), "torch": torch.__version__,
            "torch_neuronx": _version("torch-neuronx"), "neuronx_cc": _version("neuronx-cc"),
            "transformers": _version("transformers"), "diffusers": _version("diffusers")}


def instance_family(kind: str, env: Mapping[str, str], product_file: Path = DMI_PRODUCT) -> str | None:
    """The instance family the Neuron runtime compiles for ("trn2"): the platform-target override where
    set, else the instance type's family (trn2n and trn2u hosts read as trn2, ``SAME_TARGET``); ``kind``
    ("cpu", "cuda") off Neuron; None when unknown."""
    if kind != "neuron":
        return kind
    if target := env.get(COMPILER_ENV["platform_target"]):
        return target
    try:
        product = Path(product_file).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    family = product.split(".")[0].lower() or None
    return SAME_TARGET.get(family, family) if family else None


def device_keys(env: Mapping[str, str] | None = None, kind: str = "cpu",
                product_file: Path = DMI_PRODUCT) -> dict[str, str | None]:
    """The host's side of the compile key: CPU architecture, instance family, effective LNC and the
    Neuron compiler's environment. ``kind``: "neuron" when an engine runs on Neuron."""
    env = os.environ if env is None else env
    family = instance_family(kind, env, product_file)
    lnc = env.get(LNC_ENV) or (LNC_DEFAULT.get(family or "") if kind == "neuron" else None)
    return {"machine": platform.machine(), "instance_family": family, "logical_nc_config": lnc,
            **{k: env.get(v) or None for k, v in COMPILER_ENV.items()}}


def install_paths() -> dict[str, str | None]:
    """The folders traced programs name in their source locations: where torch, transformers and
    diffusers are installed (their site-packages) and the app's own folder."""
    from importlib.util import find_spec

    out: dict[str, str | None] = {}
    for name in TRACED_PACKAGES:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec else []
        out[name] = str(Path(locations[0]).resolve().parent) if locations else None
    out["app"] = str(Path(__file__).resolve().parents[2])
    return out


def fingerprint(folder: Path) -> str:
    """A hash of what a compile depends on in a model folder: its configs and its weights' names/shapes/dtypes."""
    digest = hashlib.sha256()
    folder = Path(folder)
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and len(p.relative_to(folder).parts) <= 2)
    for path in paths:
        name = path.name
        if name.endswith(".safetensors"):
            part = json.dumps(tensor_shapes(path), sort_keys=True).encode()  # name -> [dtype, shape]
        elif name in ("config.json", "model_index.json") or (name.endswith("_config.json")
                                                              and not name.startswith("tokenizer")):
            part = path.read_bytes()
        else:
            continue
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + part + b"\0")
    return digest.hexdigest()


def describe(settings, placements: Mapping, folders: Mapping[str, Path], models: Mapping[str, str],
             env: Mapping[str, str] | None = None, revisions: Mapping[str, str | None] | None = None,
             chat_rows: int = 1) -> dict:
    """This server's manifest (no file list): what its compile cache holds graphs for.

    ``revisions``: the commit sha (or revision) each engine's model was loaded at, recorded only: graphs
    depend on the fingerprint, not on the weights' values, so ``compare`` never reads it. ``chat_rows``: the rows
    of the chat's graphs (``Backend.chat_rows``).
    """
    from neuron_backend.devices import repeated_blocks  # torch: imported only when a manifest is described

    libraries = software()
    engines = {}
    for name, p in placements.items():
        entry = {"model": models[name], "revision": (revisions or {}).get(name),
                 "fingerprint": fingerprint(folders[name]) if name in folders else None,
                 "kind": p.kind, "dtype": p.dtype_name, "compile": p.compile, "backend": p.compile_backend,
                 "fullgraph": True, "dynamic": False}
        if name == "chat":
            entry.update(library=f"transformers {libraries['transformers']}",
                         context_length=settings.context_length, cache_windows=list(settings.cache_windows),
                         batch=chat_rows, prefill_chunk=getattr(settings, "prefill_chunk", None))
        else:
            entry.update(library=f"diffusers {libraries['diffusers']}",
                         repeated_blocks=repeated_blocks(settings, p))
        entry["shapes"] = [key.label for key in shape_keys(settings, name)]
        engines[name] = entry
    kind = "neuron" if any(p.kind == "neuron" for p in placements.values()) else \
        "cuda" if any(p.kind == "cuda" for p in placements.values()) else "cpu"
    return {"format": FORMAT, "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "software": libraries, "device": device_keys(env, kind), "paths": install_paths(), "engines": engines}


def _get(manifest: Mapping, dotted: str):
    value = manifest
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _shown(value) -> str:
    return "none" if value is None else str(value)


def _label(field: str) -> str:
    """"logical_nc_config" for device.logical_nc_config; an install folder keeps its prefix: "paths.torch"."""
    return field if field.startswith("paths.") else field.split(".")[-1]


def compare(bundle: Mapping, here: Mapping) -> tuple[dict[str, list[str]], list[str], int]:
    """(usable shapes per engine, mismatch lines, graphs in the bundle) of ``bundle`` on this server."""
    engines = bundle.get("engines") or {}
    total = sum(len(e.get("shapes") or []) for e in engines.values())
    mismatches = [tr("{field} {here} here, {theirs} in the bundle",
                     field=f.split(".")[-1], here=_get(here, f), theirs=_get(bundle, f))
                  for f in GLOBAL_FIELDS if _get(here, f) != _get(bundle, f)]
    every_graph_stale = bool(mismatches)
    on_neuron = any((e or {}).get("kind") == "neuron" for e in engines.values())
    key_fields = [f for f in NEFF_KEY_FIELDS if on_neuron and _get(here, f) != _get(bundle, f)]
    mismatches += [tr("{field}: made for {theirs}, this host has {here}", field=_label(f),
                      theirs=_shown(_get(bundle, f)), here=_shown(_get(here, f))) for f in key_fields]
    usable: dict[str, list[str]] = {}
    for name, theirs in engines.items():
        ours = (here.get("engines") or {}).get(name)
        shapes = list(theirs.get("shapes") or [])
        if ours is None:
            mismatches.append(tr("{engine} engine: not enabled here ({n} graphs unused)",
                                 engine=engine_name(name), n=len(shapes)))
            continue
        fields = [tr("{engine} {field}: {here} here, {theirs} in the bundle",
                     engine=engine_name(name), field=f, here=ours.get(f),
                      theirs=theirs.get(f)) for f in ENGINE_FIELDS.get(name, ()) if ours.get(f) != theirs.get(f)]
        mismatches += fields
        declared = ours.get("shapes") or []
        extra = [s for s in shapes if s not in declared]
        if extra:
            mismatches.append(tr("{engine} shapes {shapes}: in the bundle, not declared here",
                                 engine=engine_name(name), shapes=", ".join(extra)))
        fitting = [s for s in shapes if s in declared]
        if key_fields and theirs.get("kind") == "neuron" and fitting and not every_graph_stale and not fields:
            mismatches.append(tr("{engine} graphs {shapes} will not hit here: the NEFF cache key differs in "
                                 "{fields}", engine=engine_name(name), shapes=", ".join(fitting),
                                 fields=", ".join(_label(f) for f in key_fields)))
            continue
        if not every_graph_stale and not fields:
            usable[name] = fitting
    return usable, mismatches, total
