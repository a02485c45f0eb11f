"""bench/layers_once.py, the experiment off the app: the decoder layer is one nested compile region, traced and
compiled once and called for every layer inside the one whole-model graph. Here the graph, the class swap and
the wrapper; token parity with the whole-model compile is what ``bench/compile_layers_once.py`` reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, StaticCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from layers_once import compile_layers_once, wrap  # noqa: E402

LAYERS = 3


def model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=16, max_position_embeddings=256)).eval()


def decode_graph(m):
    """(the graph dynamo hands its backend for one decode step, its logits, eager logits of the same step)."""
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    out = {}
    torch._dynamo.reset()
    try:
        for compiled in (False, True):
            cache = StaticCache(config=m.config, max_cache_len=256)
            with torch.no_grad():
                m(torch.arange(3, 11).unsqueeze(0), cache=cache, use_cache=True)
                forward = torch.compile(m, backend=capture, fullgraph=True, dynamic=False) if compiled else m
                out[compiled] = forward(torch.tensor([[5]]), cache=cache, cache_position=torch.tensor([8]),
                                        use_cache=True).logits
    finally:
        torch._dynamo.reset()
    return graphs[0], out[True], out[False]


def regions(graph) -> tuple[int, int]:
    """(calls of a nested region, distinct subgraphs they call) in a dynamo graph."""
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "invoke_subgraph" in str(n.target)]
    return len(calls), len({n.args[0].target for n in calls})  # each call reads its subgraph with a get_attr


@pytest.mark.slow
def test_every_layer_calls_one_compiled_subgraph_with_the_same_logits():
    plain = model()
    graph, compiled, eager = decode_graph(plain)
    assert regions(graph) == (0, 0)  # the control: the library's own forward inlines every layer

    m = model()
    assert compile_layers_once(m) == LAYERS
    graph, compiled, eager = decode_graph(m)
    assert regions(graph) == (LAYERS, 1)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eager, decode_graph(plain)[2], rtol=0, atol=0)  # eager, the region is a plain call


def test_the_swap_is_per_model_and_done_once():
    m, other = model(), model()
    compile_layers_once(m)
    layer_class = type(m.model.layers[0])
    assert compile_layers_once(m) == LAYERS and type(m.model.layers[0]) is layer_class  # not wrapped twice
    assert type(other.model.layers[0]) is layer_class.__mro__[1]  # another model keeps the library's class
    assert layer_class.__name__ == "Qwen3DecoderLayer"


def test_the_wrapper_swaps_the_chat_models_layers_only_and_hands_the_forward_on():
    chat, image = model(), model()
    library_class = type(chat.model.layers[0])
    assert wrap("chat", chat, {}, None, None) is None  # None: the next wrapper (saved forwards) still sees it
    assert getattr(type(chat.model.layers[0]), "_compiled_once", False)
    assert wrap("image", image, {}, None, None) is None and type(image.model.layers[0]) is library_class


def test_the_app_no_longer_knows_the_experiment():
    from neuron_backend.settings import parse_settings

    with pytest.raises(SystemExit):
        parse_settings(["--chat-compile-layers-once"], env={})
