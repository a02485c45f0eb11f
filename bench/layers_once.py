"""The chat's decoder layer compiled once: an experiment, off the app until a device shows it pays on Neuron.

``compile_layers_once(model)`` makes each decoder layer a nested compile region
(``torch.compiler.nested_compile_region``): dynamo traces and compiles the layer once and calls that one
subgraph for every layer inside the same whole-model graph. ``wrap`` applies it to an engine's chat model as
a compiled-forward wrapper (``Parts(compiled=(wrap,))``, or ``ChatEngine(..., compiled=(wrap,))``), before
generate() compiles anything. Measured: docs/performance.md, section 7c (``bench/compile_layers_once.py``).
"""

from __future__ import annotations

import functools

import torch


def compile_layers_once(model) -> int:
    """Make each of ``model``'s decoder layers one nested compile region; return how many layers. Other models
    of that layer class keep the library's forward; eager, the region is a plain call."""
    names = set(getattr(model, "_no_split_modules", None) or ())  # transformers names its decoder layer here
    layers = [m for m in model.modules() if type(m).__name__ in names]
    for layer in layers:
        layer.__class__ = _layer_region(type(layer))
    return len(layers)


@functools.cache
def _layer_region(cls: type) -> type:
    if getattr(cls, "_compiled_once", False):
        return cls
    return type(cls.__name__, (cls,), {"forward": torch.compiler.nested_compile_region(cls.forward),
                                       "_compiled_once": True, "__module__": cls.__module__})


def wrap(engine: str, target, compile_config: dict, placement, settings, variant: str = ""):
    """A compiled-forward wrapper (``neuron_backend.plugins.Parts.compiled``): the chat model's layers compiled
    once; returns None, so the next wrapper (saved forwards) still sees the forward."""
    if engine == "chat":
        compile_layers_once(target)
    return None
