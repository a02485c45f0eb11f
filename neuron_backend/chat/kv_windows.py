"""Attention windows over the one static KV cache: decode reads only the part a conversation uses.

A ``StaticCache`` of ``context_length`` tokens keeps every shape fixed, but each step's attention
then reads all of it: on the full-size Qwen3-0.6B on CPU a decode step over a 4096-token cache
took 282 ms against 182 ms over 512 tokens, and at batch 4, 569 ms against 235 ms (the cache
outweighs the weights). So the cache declares a few window lengths (``--cache-windows``, the
context length always last) and each forward attends over the smallest window that holds the
sequence so far: keys and values ``[:, :, :window]`` and a mask of ``window`` columns. The cache
tensors, their addresses and the positions written stay exactly those of the plain static cache.

Shapes stay declared: the window is a Python int on the cache, so a compiled decode graph is
specialised to it (dynamo guards on its value): one graph per window, all compiled at warm-up,
reused afterwards. The same idea as NeuronX Distributed Inference's token-generation buckets.

How the window is chosen: ``attach(model)`` wraps ``model.prepare_inputs_for_generation``, which
``generate()`` calls in Python before every forward, with the tokens that forward will write: a decode
step passes the whole sequence with ``next_sequence_length=1``, a plain prefill the whole prompt, a
chunked prefill (``prefill_chunk_size``, prefill.py) each ``[B, chunk]`` chunk alone.
``WindowedStaticCache.select(new_tokens, prefill)`` adds them to the tokens the cache already holds
(``length``, a host int reset with the cache, as transformers' own ``StaticSlidingWindowLayer`` keeps
``cumulative_length_int`` beside its device counter: no device read) and sets the smallest window that
holds them all. The window never comes from the 2D attention mask: ``generate()`` drops a mask that
is all ones (a prompt that fills its bucket exactly), and a chunk's mask is cut to the chunk's end,
so a length read there was the chunk's own (64), and chunks past the first window attended over a
truncated context. The prefill forwards are those ``generate()`` marks ``is_first_iteration`` (one,
or one per chunk). ``floor`` raises the decode window only (warm-up uses it to compile a window's
graph without generating thousands of tokens).
Layers other than plain full-attention ``StaticLayer`` (sliding-window ones) keep the full cache.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer


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
        """Start writing at position 0 again, without zeroing the tensors (86 ms for the full-size
        model's cache at batch 4 on CPU): every forward writes its positions before attending, and
        the causal mask hides every position after the newest one, so old entries are never read."""
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
