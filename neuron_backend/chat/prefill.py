"""Compiled prefill on static chunks (``--prefill-chunk``): the prompt runs through the compiled forward.

``generate()`` compiles only the decode step; its prefill is an eager forward at the bucket's length,
which on Neuron dispatches (and compiles, for every new shape) each op one by one. With
``GenerationConfig.prefill_chunk_size`` set and a compiled forward, transformers 5.24's ``_prefill``
splits the padded prompt ``[B, bucket]`` into ``[B, chunk]`` pieces and runs each through the same
compiled call as decode (``get_compiled_call``), writing the static cache as it goes. The graphs
of a chunk are then ``[B, chunk]`` queries over one cache window each (kv_windows.py): the chunk
that ends at token ``k * chunk`` attends over the smallest window holding ``k * chunk`` tokens. So
the prefill graphs are a fixed, declared set (``graph_windows``), compiled by each bucket's warm-up
where they first appear, and every bucket is a whole number of chunks (settings.py checks it).

Three things the stock path does not do, which a compiled chunk needs to stay one graph:
- the cache must be initialised before the first chunk (``early_init``): a lazily initialised
  static layer is a different graph (dynamo guards on ``is_initialized``);
- the chunk's ``position_ids`` must have dense strides (kv_windows ``_dense``);
- the 4D mask must always be built (``use_static_masks``): transformers' sdpa mask skips itself
  (returns None and lets SDPA use ``is_causal``) when it sees no padding, a decision taken in
  Python on the mask's values, so a prompt of exactly a bucket's length got a graph of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..messages import tr

STATIC_SDPA = "sdpa_static_mask"  # transformers' SDPA attention, with a mask that never skips itself


def chunk_size(settings, compiled: bool) -> int:
    """Tokens per compiled prefill chunk; 0: the prefill runs eager (compile off, or --prefill-chunk 0)."""
    return settings.prefill_chunk_tokens if compiled else 0


def default_chunk(buckets: Sequence[int]) -> int:
    """The largest chunk that divides every bucket (the smallest bucket for both presets)."""
    return math.gcd(*buckets)


def graph_windows(bucket: int, chunk: int, windows: Sequence[int]) -> tuple[int, ...]:
    """The cache windows of this bucket's chunk graphs, in order (windows: the declared ones, ascending)."""
    ends = range(chunk, bucket + 1, chunk)
    return tuple(dict.fromkeys(next((w for w in windows if w >= end), windows[-1]) for end in ends))


def label(bucket: int, chunk: int, windows: Sequence[int]) -> str:
    """How this bucket's prompt pass runs, for the warm-up plan (a message: English as str)."""
    if not chunk:
        return tr("eager prefill")
    over = graph_windows(bucket, chunk, windows)
    count = bucket // chunk
    where = tr("windows {windows}" if len(over) > 1 else "window {windows}",
                windows=", ".join(str(w) for w in over))
    template = "compiled prefill: {count} chunks of {chunk} tokens over {windows}" if count > 1 else \
        "compiled prefill: 1 chunk of {chunk} tokens over {windows}"
    return tr(template, count=count, chunk=chunk, windows=where)


def use_static_masks(model) -> None:
    """Make ``model`` build its 4D attention mask on every forward (see the module docstring).

    Only for SDPA (the default): the eager mask never skips itself. Registered under a name of
    its own through transformers' ``AttentionInterface``/``AttentionMaskInterface``, so other
    models in the process keep plain ``sdpa``.
    """
    if model.config._attn_implementation not in ("sdpa", STATIC_SDPA):
        return
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def static_sdpa_mask(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(*args, **kwargs)

    AttentionInterface.register(STATIC_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(STATIC_SDPA, static_sdpa_mask)
    model.set_attn_implementation(STATIC_SDPA)


def early_init(cache, model, batch: int) -> None:
    """Allocate the static cache's tensors now, as transformers does for its own chunked prefill
    (``_prepare_static_cache``), so the first chunk's graph sees an initialised cache. A model whose
    cache cannot be initialised up front (layers on several devices) keeps the lazy path."""
    shape = model._get_static_cache_init_shape()
    if shape is not None:
        heads, head_dim = shape
        cache.early_initialization(batch_size=batch, num_heads=heads, head_dim=head_dim, dtype=model.dtype,
                                   device=model.device)


def recompile_limit(decode_windows: Sequence[int], buckets: Sequence[int], chunk: int) -> int:
    """Graphs of the one compiled forward: a decode graph per window plus the chunk graphs."""
    chunk_windows = {w for b in buckets for w in graph_windows(b, chunk, decode_windows)} if chunk else set()
    return len(decode_windows) + len(chunk_windows)
