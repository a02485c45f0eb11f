"""The compiled decode step reads the cache's keys and values in place: no copy per query-head group.

Qwen3 groups its query heads over fewer KV heads (16 over 8 in Qwen3-0.6B). transformers' SDPA attention
repeats the keys and values once per group inside torch.compile (``repeat_kv``); the engine's attention
(``static_cache.packed_decode_sdpa``) packs a decode step's query heads onto their KV heads instead, as
transformers does outside compile. Checked on the graph dynamo hands its backend, and on the logits.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, StaticCache

from neuron_backend.chat.static_cache import PACKED_SDPA, STATIC_SDPA, use_compiled_attention

CACHE = 256
KV_HEADS, GROUPS, HEAD_DIM = 2, 2, 16


def gqa_model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=KV_HEADS * GROUPS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=CACHE)
    return Qwen3ForCausalLM(config).eval()


def decode_step(model, compiled: bool):
    """One decode step after an 8-token prefill over a static cache: (logits, the graph dynamo built or None)."""
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    cache = StaticCache(config=model.config, max_cache_len=CACHE)
    prompt = torch.arange(3, 11).unsqueeze(0)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            model(prompt, cache=cache, use_cache=True)
            forward = torch.compile(model, backend=capture, fullgraph=True, dynamic=False) if compiled else model
            out = forward(torch.tensor([[5]]), cache=cache, cache_position=torch.tensor([8]),
                          use_cache=True)
    finally:
        torch._dynamo.reset()
    return out.logits, (graphs[0] if graphs else None)


def repeated_kv(graph) -> list[tuple[int, ...]]:
    """The shapes of the graph's tensors that hold the cache once per group (repeat_kv's expand)."""
    shapes = [tuple(node.meta["example_value"].shape) for node in graph.graph.nodes
              if isinstance(node.meta.get("example_value"), torch.Tensor)]
    return [s for s in shapes if s == (1, KV_HEADS, GROUPS, CACHE, HEAD_DIM)]


@pytest.mark.slow
def test_plain_sdpa_repeats_the_cache_inside_a_compiled_decode_step():
    """The control: what the check below looks for is there with transformers' own attention."""
    model = gqa_model()
    assert model.config._attn_implementation == "sdpa"
    _, graph = decode_step(model, compiled=True)
    assert repeated_kv(graph), "repeat_kv no longer shows in the graph: transformers changed, see packed_decode_sdpa"


@pytest.mark.slow
@pytest.mark.parametrize("static_masks", [False, True])
@pytest.mark.parity
def test_the_engines_attention_reads_the_cache_in_place_with_the_same_logits(static_masks):
    model = gqa_model()
    reference, _ = decode_step(model, compiled=False)  # transformers' sdpa, eager
    use_compiled_attention(model, static_masks=static_masks)
    assert model.config._attn_implementation == (STATIC_SDPA if static_masks else PACKED_SDPA)
    logits, graph = decode_step(model, compiled=True)
    assert not repeated_kv(graph)
    torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)
    eager, _ = decode_step(model, compiled=False)
    torch.testing.assert_close(eager, reference, rtol=1e-5, atol=1e-5)
