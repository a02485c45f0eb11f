"""Compiled forwards saved whole and loaded on a warm start without tracing the model again: ``AotForward``.

``attach`` makes it the chat model's ``get_compiled_call`` (``generate()``'s forward), ``attach_module`` the
``_compiled_call_impl`` of a module compiled whole (the image transformer). Each call is keyed by what its graph
is specialised to (``call_key``); a new key is compiled with ``aot_compile`` and saved under
``<folder>/<namespace>/``, signed with this installation's key; a saved key is loaded only when its signature
verifies or the folder is trusted. A key that cannot be saved runs the plain compiled call. How it works and
why: docs/bundles.md, "Saved compiled forwards".
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import importlib.metadata
import io
import json
import logging
import os
import re
import secrets
import sys
import threading
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

import neuron_backend

log = logging.getLogger(__name__)
# the code a saved graph was traced through, besides the libraries
SOURCES = (Path(__file__), Path(neuron_backend.__file__).parent / "chat" / "static_cache.py")


def forward(model, **kwargs):
    """What is compiled for the chat: the model's forward, returning its logits."""
    return model(**kwargs).logits


def module_forward(module, **kwargs):
    """What is compiled for a module compiled whole (the image transformer): its forward's first output."""
    return module.forward(**kwargs)[0]


def _chat_output(logits, kwargs: dict):
    return CausalLMOutputWithPast(logits=logits, cache=kwargs.get("cache", kwargs.get("past_key_values")))


def _module_output(sample, kwargs: dict):
    return (sample,)


def _stance() -> str:
    """torch.compiler.set_stance's current stance: a saved function honours it as the plain compiled call does."""
    return torch._dynamo.eval_frame._stance.stance


def _keep_no_guards(entries):
    return [False for _ in entries]


def _value_key(value):
    """One argument as a compiled graph sees it (NotImplemented: a kind not keyed here)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), str(value.dtype), str(value.device))
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    if isinstance(value, dict):  # the compiled attention's masks, by layer type
        parts = tuple((str(k), _value_key(v)) for k, v in sorted(value.items()))
        return NotImplemented if any(part is NotImplemented for _, part in parts) else ("dict", parts)
    if isinstance(value, Cache):
        layers = tuple((type(layer).__name__, bool(getattr(layer, "is_initialized", False)),
                        tuple(layer.keys.shape) if getattr(layer, "keys", None) is not None else None)
                       for layer in value.layers)
        return (type(value).__name__, getattr(value, "window", None), layers)
    return NotImplemented


def call_key(kwargs: dict) -> str | None:
    """What a compiled forward is specialised to, as text; None when an argument is of a kind not keyed here."""
    parts = [("grad", torch.is_grad_enabled())]
    for name in sorted(kwargs):
        part = _value_key(kwargs[name])
        if part is NotImplemented:
            return None
        parts.append((name, part))
    return repr(parts)


def namespace(model, compile_config: dict, variant: str = "") -> str:
    """A hash of what a saved graph depends on besides its call key (``variant``: the engine's own choices
    that change the graph, e.g. the decoder layer compiled once, the compiled attention's static masks)."""
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)  # diffusers: a dict
    facts = {"torch": torch.__version__, "python": sys.version, "class": type(model).__qualname__,
             "libraries": {name: _version(name) for name in ("transformers", "diffusers")},
             "config": {k: v for k, v in config.items() if k != "_name_or_path"},  # not the folder
             "dtype": str(model.dtype),
             "device": str(model.device), "compile": repr(sorted(compile_config.items())), "variant": variant,
             "attention": str(getattr(model.config, "_attn_implementation", None)),
             "sources": [hashlib.sha256(path.read_bytes()).hexdigest() for path in SOURCES]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module_aliases(compiled) -> dict[str, str]:
    """Alias -> module name of the module objects the saved code refers to and torch does not record."""
    env = compiled._artifacts.runtime_env
    by_id = {str(id(module)): name for name, module in list(sys.modules.items()) if module is not None}
    aliases = {}
    for ref in env.external_refs - set(env.import_sources) - set(env.used_globals) - set(globals()):
        found = re.fullmatch(r"___module_.+?_(\d+)_c\d+", ref)
        if found and found.group(1) in by_id:
            aliases[ref] = by_id[found.group(1)]
    return aliases


class AotForward:
    """A compiled call (``generate()``'s forward, a module's ``_compiled_call_impl``): per call key, a function
    loaded or compiled ahead of time and saved. ``compiled``: what is compiled (called with the model and the
    call's keyword arguments); ``output``: the call's answer from the function's and the arguments; ``plain``:
    the plain compiled call, for keys that cannot be saved (``torch.compile`` of the model's ``__call__`` when
    None)."""

    def __init__(self, model, folder: Path, compile_config: dict, variant: str = "", compiled=forward,
                 output=_chat_output, plain=None, key: bytes | None = None, trusted: bool = False):
        self.model, self.compiled, self.output = model, compiled, output
        self.key, self.trusted = key, trusted  # the signing key (None: nothing loads unless trusted)
        self.folder = Path(folder) / namespace(model, compile_config, variant)
        # torch.compile takes a mode or options, not both; "default" is no mode
        self.options = {k: v for k, v in compile_config.items() if k not in ("options", "mode")}
        self.options["options"] = {**(compile_config.get("options") or {}), "guard_filter_fn": _keep_no_guards}
        if compile_config.get("mode") not in (None, "default"):
            self.options["mode"] = compile_config["mode"]  # refused with the options: such keys run the plain call
        self.plain = plain or torch.compile(model.__call__, **compile_config)  # keys that cannot be saved
        self.functions: dict[str, object] = {}
        self.loaded = self.saved = 0  # functions loaded from the folder, compiled and saved by this process
        self._unsaved: set[str] = set()
        self.save_errors: dict[str, str] = {}  # call key -> why its compiled function could not be saved
        self._lock = threading.Lock()

    @property
    def refused_saves(self) -> int:
        """Call keys compiled ahead of time whose save failed: they serve this process, compiled on each start."""
        return len(self.save_errors)

    @property
    def refused(self) -> int:
        """Call keys whose ahead-of-time compile was refused: they run the plain compiled call, traced each start."""
        return len(self._unsaved)

    def __call__(self, *args, **kwargs):
        key = None if args or _stance() == "force_eager" else call_key(kwargs)
        if key is None or key in self._unsaved or (self.output is _module_output and kwargs.get("return_dict", True)):
            return self.plain(*args, **kwargs)
        function = self.functions.get(key) or self._function(key, kwargs)
        if function is None:
            return self.plain(**kwargs)
        return self.output(function(self.model, **kwargs), kwargs)

    def _function(self, key: str, kwargs: dict):
        with self._lock:
            if key in self.functions:
                return self.functions[key]
            path = self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.aot"
            function = self._load(path) if path.exists() else None
            if function is None and _stance() == "fail_on_recompile":  # as torch.compile under that stance
                raise torch._dynamo.exc.RecompileError(
                    f"Detected recompile when torch.compile stance is 'fail_on_recompile': {type(self.model).__name__} "
                    f"called with a key no warm-up compiled or saved ({path.name})")
            if function is None and _stance() == "eager_on_recompile":
                return None  # the plain compiled call runs it eager
            if function is None:
                function = self._compile(path, key, kwargs)
            if function is not None:
                self.functions[key] = function
            return function

    def _load(self, path: Path):
        try:
            graph, names = path.read_bytes(), path.with_suffix(".modules.json").read_bytes()
        except OSError as error:
            log.warning("could not read the saved compiled forward %s (%s); compiling it again", path.name, error)
            return None
        if not self.trusted and not self._signed(path, graph, names):
            log.warning("the saved compiled forward %s was not written by this installation (no valid signature "
                        "with --aot-key-file); compiling it again. Start with --aot-trust to load forwards you "
                        "trust (a bundle).", path.name)
            return None
        try:  # exactly the bytes checked above
            aliases = json.loads(names)
            scope = {**globals(), **{alias: importlib.import_module(name) for alias, name in aliases.items()}}
            function = torch.compiler.load_compiled_function(io.BytesIO(graph), f_globals=scope)
        except Exception as error:  # noqa: BLE001 - a torn or foreign file: this key compiles again, saved over
            log.warning("could not load the saved compiled forward %s (%s); compiling it again", path.name, error)
            return None
        self.loaded += 1
        counters["showcase"]["aot_loaded"] += 1  # the warm-up counts it a cache hit (CompileCounter.loaded)
        return function

    def _compile(self, path: Path, key: str, kwargs: dict):
        try:
            # a fresh options dict each time: torch.compile pops guard_filter_fn out of the one it is given
            options = {**self.options, "options": dict(self.options["options"])}
            function = torch.compile(self.compiled, **options).aot_compile(((self.model,), kwargs))
        except Exception as error:  # noqa: BLE001 - e.g. a graph break: the key runs the plain compiled call
            log.warning("the %s forward could not be compiled ahead of time (%s): it is traced on every start",
                        type(self.model).__name__, error)
            self._unsaved.add(key)
            return None
        temp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            function.save_compiled_function(str(temp))
            names = json.dumps(_module_aliases(function)).encode()
            path.with_suffix(".modules.json").write_bytes(names)
            if self.key is not None:
                path.with_suffix(".sig").write_text(signature(self.key, temp.read_bytes(), names))
            temp.replace(path)  # the graph last: a reader that finds it finds its aliases and signature too
            self.saved += 1
        except Exception as error:  # noqa: BLE001 - a refused save: the compiled function still serves
            self._refuse_save(key, temp, error)
        return function

    def _refuse_save(self, key: str, temp: Path, error: BaseException) -> None:
        """A compiled function that could not be saved (a full or read-only cache, or a backend result that does
        not pickle): counted, logged once per process, and kept serving this process; the next start compiles it."""
        temp.unlink(missing_ok=True)
        first = not self.save_errors
        self.save_errors[key] = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"[:300]
        if first:
            log.warning("could not save the compiled %s forward in %s (%s): it serves this process and is "
                        "compiled again on the next start", type(self.model).__name__, self.folder,
                        self.save_errors[key])


    def _signed(self, path: Path, graph: bytes, names: bytes) -> bool:
        try:
            said = path.with_suffix(".sig").read_text().strip()
        except OSError:
            return False
        return self.key is not None and hmac.compare_digest(said, signature(self.key, graph, names))


def signature(key: bytes, graph: bytes, names: bytes) -> str:
    """The HMAC-SHA256 of a saved forward: its graph's bytes and its aliases' bytes, each by its sha256."""
    message = hashlib.sha256(graph).digest() + hashlib.sha256(names).digest()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def installation_key(path: Path) -> bytes:
    """This installation's signing key at ``path``: read, or made once (32 random bytes, readable by its owner
    only). Safe when several processes start at once: the first file linked into place wins."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(descriptor, secrets.token_bytes(32))
        finally:
            os.close(descriptor)
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
        finally:
            temp.unlink()
    return path.read_bytes()


def attach(model, folder: Path, compile_config: dict, variant: str = "", **signing) -> AotForward:
    """Make ``generate()``'s compiled forward an ``AotForward`` saving under ``folder`` (``signing``: its ``key``
    and ``trusted``)."""
    aot = AotForward(model, folder, compile_config, variant, **signing)
    model.get_compiled_call = lambda config: aot
    return aot


def attach_module(module: torch.nn.Module, folder: Path, compile_config: dict, variant: str = "",
                  **signing) -> AotForward:
    """Make a module compiled whole (``Module.compile``, done here when not yet) call an ``AotForward`` saving
    under ``folder``; its plain compiled call serves the keys that cannot be saved."""
    if module._compiled_call_impl is None:
        module.compile(**compile_config)
    aot = AotForward(module, folder, compile_config, variant, compiled=module_forward, output=_module_output,
                     plain=module._compiled_call_impl, **signing)
    module._compiled_call_impl = aot
    return aot
