"""The one static KV cache and the compiled forward over it: attention windows, static prefill chunks.

``WindowedStaticCache`` attends each forward over the smallest declared window that holds the sequence so
far (``attach`` makes ``generate()`` choose it); the prefill runs compiled in ``[B, chunk]`` pieces, one
``Graph`` per chunk and window. Why and how: docs/trainium.md, "The chat's static cache".
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from ..messages import tr


def declared(windows: Sequence[int], max_cache_len: int) -> tuple[int, ...]:
    """The windows a cache of ``max_cache_len`` tokens uses: the smaller ones given, then the whole cache."""
    return tuple(sorted({w for w in windows if w < max_cache_len})) + (max_cache_len,)


def window_for(windows: Sequence[int], length: int) -> int:
    """The smallest window holding ``length`` tokens (the last window is the whole cache)."""
    return next((w for w in windows if w >= length), windows[-1])


class WindowedStaticLayer(StaticLayer):
    """A ``StaticLayer`` whose attention reads the first ``cache.window`` positions only."""

    def __init__(self, max_cache_len: int, cache: WindowedStaticCache, **kwargs):
        super().__init__(max_cache_len, **kwargs)
        self._cache = cache

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        window = self._cache.window
        return keys[:, :, :window], values[:, :, :window]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache.window, 0

    def reset(self) -> None:
        """Start writing at position 0 again without zeroing the tensors: the causal mask hides old entries."""
        self.cumulative_length.zero_()


class WindowedStaticCache(StaticCache):
    """The static cache of ``max_cache_len`` tokens, attended through declared windows."""

    def __init__(self, config, max_cache_len: int, windows: Sequence[int] = ()):
        super().__init__(config=config, max_cache_len=max_cache_len)
        self.windows = declared(windows, max_cache_len)
        self.window = max_cache_len  # what the next forward attends over
        self.length = 0  # tokens written so far: the layers' cumulative_length, kept on the host
        self.floor = 0  # warm-up: the smallest window a decode step may use
        self.layers = [WindowedStaticLayer(max_cache_len, self) if type(layer) is StaticLayer else layer
                       for layer in self.layers]

    def reset(self) -> None:
        super().reset()
        self.length = 0

    def select(self, new_tokens: int, prefill: bool = False) -> int:
        """Set the window for the next forward, which writes ``new_tokens`` after the ``length`` cached."""
        self.length += new_tokens
        window = window_for(self.windows, self.length)
        if not prefill:
            window = max(window, window_for(self.windows, self.floor))
        self.window = window
        return window


def attach(model) -> None:
    """Make ``model.generate()`` pick the window before every forward when its cache is windowed."""
    original = model.prepare_inputs_for_generation
    if getattr(original, "_kv_windows", False):
        return

    @functools.wraps(original)
    def prepare_inputs_for_generation(input_ids, *args, **kwargs):
        cache = kwargs.get("cache")
        if not isinstance(cache, WindowedStaticCache):
            return original(input_ids, *args, **kwargs)
        # The tokens this forward writes: next_sequence_length for a decode step (1) and a plain prefill
        # (the prompt; a 0-d tensor where transformers subtracted the cache's device counter), else
        # input_ids itself (a prefill chunk comes alone, [B, chunk])
        new = kwargs.get("next_sequence_length")
        cache.select(int(new) if new is not None else input_ids.shape[1],
                     prefill=bool(kwargs.get("is_first_iteration")))
        if kwargs.get("position_ids") is not None:  # still on the host here
            kwargs["position_ids"] = _dense(kwargs["position_ids"])
        return original(input_ids, *args, **kwargs)

    prepare_inputs_for_generation._kv_windows = True
    model.prepare_inputs_for_generation = prepare_inputs_for_generation


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the strides of a fresh tensor of its shape. A prefill chunk's positions are a slice
    of the bucket's (``[B, chunk]``, stride ``(bucket, 1)``; ``is_contiguous()`` ignores a stride of
    a size-1 dim, dynamo does not): a compiled graph guards on strides, so without this every bucket
    compiled its own chunk graph."""
    dense, step = [], 1
    for size in reversed(t.shape):
        dense.insert(0, step)
        step *= size
    return t if tuple(t.stride()) == tuple(dense) else t.clone(memory_format=torch.contiguous_format)


STATIC_SDPA = "sdpa_static_mask"  # packed_decode_sdpa, with a mask that never skips itself
PACKED_SDPA = "sdpa_packed_decode"  # packed_decode_sdpa, with transformers' own SDPA mask


def chunk_size(settings, compiled: bool) -> int:
    """Tokens per compiled prefill chunk; 0: the prefill runs eager (compile off, or --prefill-chunk 0)."""
    return settings.prefill_chunk_tokens if compiled else 0


def graph_windows(bucket: int, chunk: int, windows: Sequence[int]) -> tuple[int, ...]:
    """The cache windows of this bucket's chunk graphs, in order (windows: the declared ones, ascending)."""
    ends = range(chunk, bucket + 1, chunk)
    return tuple(dict.fromkeys(next((w for w in windows if w >= end), windows[-1]) for end in ends))


class Graph(NamedTuple):
    """One graph of the compiled forward: ``[B, tokens]`` queries (1: decode, else a prefill chunk) over
    ``window`` cache positions; the same key in every bucket that runs it, so a failed graph is known again."""

    tokens: int
    window: int

    @property
    def label(self) -> str:
        """The graph as the warm-up table names it (a message: English as str)."""
        if self.tokens == 1:
            return tr("decode over window {window}", window=self.window)
        return tr("prefill chunk of {tokens} tokens over window {window}", tokens=self.tokens, window=self.window)


def prefill_graphs(bucket: int, chunk: int, windows: Sequence[int]) -> frozenset[Graph]:
    """The chunk graphs of this bucket's compiled prefill (none when the prefill runs eager: ``chunk`` 0)."""
    return frozenset(Graph(chunk, w) for w in graph_windows(bucket, chunk, windows)) if chunk else frozenset()


def decode_graphs(bucket: int, windows: Sequence[int]) -> frozenset[Graph]:
    """The decode graphs a reply at this bucket may run: every window from the one its first new token needs."""
    first = window_for(windows, bucket + 1)
    return frozenset(Graph(1, w) for w in windows if w >= first)


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


def packed_decode_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                       position_bias=None, **kwargs):
    """transformers' SDPA attention, except that a decode step (one query token) over grouped KV heads runs
    with its query heads packed onto their KV heads (``pack_gqa``), reading the keys and values in place,
    inside torch.compile too. Why: docs/performance.md, section 7b.
    """
    from transformers.integrations.sdpa_attention import pack_gqa, sdpa_attention_forward, use_gqa_in_sdpa

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1 or position_bias is not None or use_gqa_in_sdpa(attention_mask, key,
                                                                                          value):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, position_bias=position_bias, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(pack_gqa(query, groups), key, value,
                                                           attn_mask=pack_gqa(attention_mask, groups),
                                                           dropout_p=dropout, scale=scaling)
    return out.reshape(out.shape[0], -1, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def use_compiled_attention(model, static_masks: bool) -> None:
    """Give ``model`` the attention of the compiled forward: ``packed_decode_sdpa`` and, with ``static_masks``
    (compiled prefill chunks), a 4D mask built on every forward. Only for SDPA (the default); registered under
    names of their own, so other models in the process keep plain ``sdpa``.
    """
    if model.config._attn_implementation not in ("sdpa", STATIC_SDPA, PACKED_SDPA):
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def static_sdpa_mask(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = False
        return sdpa_mask(*args, **kwargs)

    AttentionInterface.register(STATIC_SDPA, packed_decode_sdpa)
    AttentionMaskInterface.register(STATIC_SDPA, static_sdpa_mask)
    AttentionInterface.register(PACKED_SDPA, packed_decode_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
    model.set_attn_implementation(STATIC_SDPA if static_masks else PACKED_SDPA)


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
