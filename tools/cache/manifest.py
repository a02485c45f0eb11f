"""What a compile cache was built for, and whether a bundle built elsewhere fits this server.

A manifest is plain JSON: the declared shapes of each engine, the model each engine ran (its id, the
commit sha of the revision loaded, and a fingerprint of its configs and weight headers: names, dtypes
and shapes, not values, since compile keys depend on those), device kind and what the Neuron compiler's
cache key depends on (platform target, logical-core config, compiler flags), software versions and
compile options. The app writes one next to its compile cache when warm-up ends
(``compile-cache/manifest.json``); an exported bundle carries it plus a sha256 per file.

``compare`` checks a bundle's manifest against this server's, field by field: a field every graph
depends on (torch, torch-neuronx, the Neuron compiler, Python, the CPU architecture, the Neuron
platform and flags) makes every graph unusable; a field of one engine (its model, dtype, device
kind, compile options, cache length...) makes that engine's graphs unusable; otherwise each shape
this server declares and the bundle holds is usable.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from neuron_backend.messages import tr
from neuron_backend.shapes import engine_name, shape_keys

FORMAT = 1
# Environment the Neuron compiler reads into its cache key (NOTES.md 1b): recorded, never set here.
COMPILER_ENV = {"platform_target": "NEURON_PLATFORM_TARGET_OVERRIDE",
                "logical_nc_config": "NEURON_LOGICAL_NC_CONFIG", "compiler_flags": "NEURON_CC_FLAGS"}
GLOBAL_FIELDS = ("software.python", "software.torch", "software.torch_neuronx", "software.neuronx_cc",
                 "device.machine", "device.platform_target", "device.logical_nc_config", "device.compiler_flags")
ENGINE_FIELDS = {
    "chat": ("model", "fingerprint", "kind", "dtype", "compile", "backend", "fullgraph", "dynamic", "library",
             "context_length", "cache_windows", "batch", "prefill_chunk"),
    "image": ("model", "fingerprint", "kind", "dtype", "compile", "backend", "fullgraph", "dynamic", "library",
              "repeated_blocks"),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # a safetensors header above this is not one


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


def device_keys(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The host's side of the compile key: CPU architecture and the Neuron compiler's environment."""
    env = os.environ if env is None else env
    return {"machine": platform.machine(), **{k: env.get(v) or None for k, v in COMPILER_ENV.items()}}


def _safetensors_header(path: Path) -> dict:
    """Tensor names, dtypes and shapes of a .safetensors file (its JSON header; values not read)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"{path.name}: header of {size} bytes is not a safetensors header")
        header = json.loads(f.read(size))
    return {k: [v["dtype"], v["shape"]] for k, v in header.items() if k != "__metadata__"}


def fingerprint(folder: Path) -> str:
    """A hash of what a compile depends on in a model folder: its configs and its weights' names/shapes/dtypes."""
    digest = hashlib.sha256()
    folder = Path(folder)
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and len(p.relative_to(folder).parts) <= 2)
    for path in paths:
        name = path.name
        if name.endswith(".safetensors"):
            part = json.dumps(_safetensors_header(path), sort_keys=True).encode()
        elif name in ("config.json", "model_index.json") or (name.endswith("_config.json")
                                                              and not name.startswith("tokenizer")):
            part = path.read_bytes()
        else:
            continue
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + part + b"\0")
    return digest.hexdigest()


def describe(settings, placements: Mapping, folders: Mapping[str, Path], models: Mapping[str, str],
             env: Mapping[str, str] | None = None, revisions: Mapping[str, str | None] | None = None) -> dict:
    """This server's manifest (no file list): what its compile cache holds graphs for.

    ``revisions``: the commit sha (or revision) each engine's model was loaded at, recorded only: graphs
    depend on the fingerprint, not on the weights' values, so ``compare`` never reads it.
    """
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
                         batch=settings.chat_batch, prefill_chunk=getattr(settings, "prefill_chunk", None))
        else:
            entry.update(library=f"diffusers {libraries['diffusers']}",
                         repeated_blocks=settings.compile_repeated_blocks)
        entry["shapes"] = [key.label for key in shape_keys(settings, name)]
        engines[name] = entry
    return {"format": FORMAT, "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "software": libraries, "device": device_keys(env), "engines": engines}


def _get(manifest: Mapping, dotted: str):
    value = manifest
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def compare(bundle: Mapping, here: Mapping) -> tuple[dict[str, list[str]], list[str], int]:
    """(usable shapes per engine, mismatch lines, graphs in the bundle) of ``bundle`` on this server."""
    total = sum(len(e.get("shapes") or []) for e in (bundle.get("engines") or {}).values())
    mismatches = [tr("{field} {here} here, {theirs} in the bundle",
                     field=f.split(".")[-1], here=_get(here, f), theirs=_get(bundle, f))
                  for f in GLOBAL_FIELDS if _get(here, f) != _get(bundle, f)]
    every_graph_stale = bool(mismatches)
    usable: dict[str, list[str]] = {}
    for name, theirs in (bundle.get("engines") or {}).items():
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
        if not every_graph_stale and not fields:
            usable[name] = [s for s in shapes if s in declared]
    return usable, mismatches, total
