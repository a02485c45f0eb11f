"""The compiled, chunked and windowed chat paths give plain ``generate()``'s answer, token for token.

A model with the real Qwen3-0.6B shapes (hidden 1024, 16 heads, 8 KV heads, head_dim 128, the
151,936-token vocabulary) cut to 2 layers, float32, the genuine Qwen3 tokenizer and chat template,
and the full preset's shapes: buckets 64, 256, 1024, 3072, cache windows 512, 1024, 2048 of a 4096
cache, 64-token prefill chunks. Prompts fill each bucket exactly (no padding: ``generate()`` then
drops the attention mask), fall one token short and one over, and cross the window boundaries, in
the prompt and in the decode (an exact 1024 decodes into window 2048).
"""

from __future__ import annotations

import threading

import pytest
import torch
from support.qwen3 import qwen3_folder

from neuron_backend.chat.engine import ChatEngine, ChatRequest, _Prompt
from neuron_backend.devices import CompileCounter, HostDevices, resolve_placements
from neuron_backend.settings import parse_settings
from tools.aot import plugin as saved_forwards
from tools.chat_batch import plugin as chat_batch
from tools.chat_batch.batch import BatchRow, Sampling

pytestmark = pytest.mark.parity

NEW_TOKENS = 4
LENGTHS = (63, 64, 65, 255, 256, 257, 513, 1023, 1024, 1025, 2049, 3071, 3072)


@pytest.fixture(scope="module")
def qwen3_2_layers(tmp_path_factory):
    """Qwen3-0.6B's config.json with 2 of its 28 layers, random weights (seed 0), the genuine tokenizer."""
    return qwen3_folder(tmp_path_factory.mktemp("qwen3-0.6b-2-layers"), hidden_size=1024, intermediate_size=3072,
                        num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                        rms_norm_eps=1e-6)


@pytest.fixture(scope="module")
def eager_chat(qwen3_2_layers, tmp_path_factory) -> ChatEngine:
    """One eager engine (the full preset's shapes) for the tests that only generate with it: a load of the
    model is seconds. Its model also gives plain generate()'s references: generate() keeps no state."""
    return engine(qwen3_2_layers, tmp_path_factory.mktemp("eager"))


@pytest.fixture(scope="module")
def references(eager_chat) -> dict[int, tuple[list[int], list[int]]]:
    """For each length in LENGTHS: the prompt's ids and plain generate()'s greedy reply to it."""
    prompts = {length: chat_prompt(eager_chat.tokenizer, length) for length in LENGTHS}
    return {length: (ids, plain_generate(eager_chat.model, ids)) for length, ids in prompts.items()}


def engine(folder, tmp_path, *flags: str) -> ChatEngine:
    settings = parse_settings(["--models", "full", "--device", "cpu", "--dtype", "float32",
                               "--cache-dir", str(tmp_path), *flags], env={}, plugins=(saved_forwards, chat_batch))
    assert (settings.buckets, settings.cache_windows, settings.context_length) == (
        (64, 256, 1024, 3072), (512, 1024, 2048), 4096)
    # as app.py runs it: with the saved-forwards plug-in (auto: on where the chat compiles with inductor) and the
    # batch of --chat-batch
    chat = ChatEngine(settings, resolve_placements(settings, HostDevices(0, None, 0))["chat"], "qwen3 2 layers",
                      saved_forwards.plug(settings).compiled, chat_batch.plug(settings).chat_batch)
    chat.load(folder)
    return chat


def chat_prompt(tokenizer, length: int) -> list[int]:
    """A genuine chat-template prompt of exactly ``length`` tokens: the template's own tokens around a
    user message cut to fit (the same ids ``apply_chat_template`` gives that message's tokens)."""
    marker = "MARKER"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
    head, tail = rendered.split(marker)
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    tail_ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
    words = " ".join(f"word{i} on Trainium, with shapes declared up front." for i in range(700))
    body = tokenizer(words, add_special_tokens=False)["input_ids"][: length - len(head_ids) - len(tail_ids)]
    ids = head_ids + body + tail_ids
    assert len(ids) == length
    return ids


def bucket_of(chat: ChatEngine, length: int) -> int:
    return min(b for b in chat.buckets if b >= length)


def plain_generate(model, ids: list[int]) -> list[int]:
    """transformers' own greedy generate(): no padding, no static cache, no windows, no chunks."""
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=151643)
    return out[0, len(ids):].tolist()


def engine_generate(chat: ChatEngine, ids: list[int], chunk: int | None = None) -> list[int]:
    """The engine's own generate() call for a greedy reply; ``chunk`` forces eager prefill chunks."""
    bucket = bucket_of(chat, len(ids))
    prompt = _Prompt(ids, bucket, 0, NEW_TOKENS, False)
    kwargs = chat._generate_kwargs(ChatRequest("x", greedy=True, max_new_tokens=NEW_TOKENS), prompt,
                                   threading.Event(), None, NEW_TOKENS)
    if chunk:
        kwargs["prefill_chunk_size"] = chunk
    return chat.model.generate(**kwargs)[0, bucket:].tolist()


@pytest.mark.slow
def test_the_window_follows_the_cache_when_a_full_prompt_has_no_mask(eager_chat):
    """An exact fill of 1024 in 64-token chunks: generate() drops its all-ones mask, and each chunk must
    still attend over the window of every token cached so far (512 for chunks 1-8, then 1024), and the
    decode over 2048 once it passes 1024."""
    from support.window_probe import record_windows

    ids = chat_prompt(eager_chat.tokenizer, 1024)
    seen = record_windows(eager_chat)
    try:
        engine_generate(eager_chat, ids, chunk=64)
    finally:
        del eager_chat._cache(1).select  # the cache's own select again (record_windows set it on the instance)
    assert seen == [512] * 8 + [1024] * 8 + [2048] * (NEW_TOKENS - 1)


@pytest.mark.slow
def test_eager_and_chunked_prefill_give_plain_generates_tokens(eager_chat, references):
    for length, (ids, reference) in references.items():
        assert engine_generate(eager_chat, ids) == reference, f"eager, {length} tokens"
        assert engine_generate(eager_chat, ids, chunk=64) == reference, f"eager in 64-token chunks, {length} tokens"


@pytest.mark.slow
def test_compiled_prefill_gives_plain_generates_tokens(qwen3_2_layers, references, tmp_path):
    """--compile on (the Neuron default): compiled 64-token chunks and compiled decode, every shape
    warmed up first, then no compile at all and plain generate()'s tokens for every prompt."""
    chat = engine(qwen3_2_layers, tmp_path, "--compile", "on")
    assert chat.prefill_chunk == 64 and chat.saved_forwards is not None  # through the saved forwards, as the app
    torch._dynamo.reset()
    for key in chat.shapes.keys():
        chat.warm_up(key)
    before = CompileCounter.graphs()
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            for length, (ids, reference) in references.items():
                assert engine_generate(chat, ids) == reference, f"compiled, {length} tokens"
        assert CompileCounter.graphs() == before
    finally:
        # Dynamo keeps these 8 graphs on Qwen3's forward, which every chat model shares: a later compiled test
        # would count them against its own recompile limit and fail its warm-up.
        torch._dynamo.reset()


@pytest.mark.slow
def test_a_batch_of_full_rows_gives_plain_generates_tokens(qwen3_2_layers, references, tmp_path):
    """--chat-batch 2 with both rows filling bucket 1024 exactly (no padding anywhere, so no mask), in
    64-token chunks; and one full row beside a padding row."""
    chat = engine(qwen3_2_layers, tmp_path, "--chat-batch", "2", "--prefill-chunk", "64")
    scheduler = chat.runner().scheduler
    first, first_reply = references[1024]
    second = first[::-1]  # another 1024 tokens: the two rows differ
    replies = [first_reply, plain_generate(chat.model, second)]  # plain generate()'s, as in ``references``
    original = chat.model.generate

    def chunked(**kwargs):
        return original(**kwargs, prefill_chunk_size=64)

    chat.model.generate = chunked
    try:
        for group in ([first, second], [first]):
            rows = [BatchRow(ids, 1024, NEW_TOKENS, Sampling(greedy=True)) for ids in group]
            scheduler.run(rows)
            assert [r.result.new_ids for r in rows] == replies[: len(group)], len(group)
    finally:
        chat.model.generate = original
