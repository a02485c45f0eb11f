"""Cache windows: each forward attends over the smallest declared window that holds the text so far."""

from __future__ import annotations

import pytest
import torch
from support.window_probe import record_windows

from neuron_backend.chat.engine import ChatEngine, ChatRequest, _Prompt
from neuron_backend.chat.static_cache import WindowedStaticCache, declared, window_for
from neuron_backend.devices import HostDevices, resolve_placements
from neuron_backend.errors import ConfigError
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import PromptBucket


def make_engine(settings, folder) -> ChatEngine:
    placement = resolve_placements(settings, HostDevices(0, None, 0))["chat"]
    engine = ChatEngine(settings, placement, "demo Qwen3 (tiny)")
    engine.load(folder)
    return engine


@pytest.fixture
def windowed(tiny_settings):
    """The tiny preset (context 256, no windows of its own) with one window of 128 tokens."""
    return tiny_settings.replace(cache_windows=(128,))


def test_window_choice():
    assert declared((2048, 512, 1024, 4096, 9000), 4096) == (512, 1024, 2048, 4096)
    assert declared((), 256) == (256,)
    windows = (128, 256)
    assert [window_for(windows, n) for n in (1, 128, 129, 256, 300)] == [128, 128, 256, 256, 256]


def test_windows_are_settings_with_errors_that_say_what_is_allowed():
    assert parse_settings(["--models", "tiny"], env={}).cache_windows == ()
    assert parse_settings(["--models", "full"], env={}).cache_windows == (512, 1024, 2048)
    assert parse_settings(["--cache-windows", "none"], env={}).cache_windows == ()
    assert parse_settings([], env={"SHOWCASE_CACHE_WINDOWS": "64,32"}).cache_windows == (32, 64)
    # the preset's windows are kept only below a smaller context length chosen by the user
    assert parse_settings(["--models", "full", "--context-length", "1000", "--chat-buckets", "64,256"],
                          env={}).cache_windows == (512,)
    with pytest.raises(ConfigError, match="--cache-windows: window 300 is outside 1..256"):
        parse_settings(["--models", "tiny", "--context-length", "256", "--chat-buckets", "32,64,128",
                        "--cache-windows", "300"], env={})


def test_each_forward_uses_the_smallest_window_that_holds_the_sequence(windowed, demo_models):
    engine = make_engine(windowed, demo_models.chat)
    seen = record_windows(engine)
    ids = engine.tokenizer(" the" * 30, add_special_tokens=False)["input_ids"][:30]
    final = list(engine._run(ChatRequest("x", max_new_tokens=120), _Prompt(ids, 32, 0, 120, False), 120))[-1]
    assert final.stats.new_tokens == 120
    # prefill of 32 -> window 128; decode forwards for lengths 33..151 (the last token is not fed back)
    assert seen == [128] + [128] * (128 - 32) + [256] * (151 - 128)


def test_a_floor_raises_decode_windows_only(windowed, demo_models):
    engine = make_engine(windowed, demo_models.chat)
    seen = record_windows(engine)
    ids = engine.tokenizer(" the" * 30, add_special_tokens=False)["input_ids"][:30]
    list(engine._run(ChatRequest("x", max_new_tokens=3), _Prompt(ids, 32, 0, 3, False, window_floor=256), 3))
    assert seen == [128, 256, 256]  # the prefill keeps its bucket's window
    seen.clear()
    list(engine._run(ChatRequest("x", max_new_tokens=2), _Prompt(ids, 32, 0, 2, False), 2))
    assert seen == [128, 128]  # the floor was for that call only


@pytest.mark.slow
@pytest.mark.parametrize("greedy", [True, False])
def test_replies_are_those_of_the_whole_cache(windowed, demo_models, greedy):
    """Same tokens with windows (128, 256) as with one window of the whole cache, across the switch."""
    engine = make_engine(windowed, demo_models.chat)
    whole = make_engine(windowed.replace(cache_windows=()), demo_models.chat)
    assert engine._windows() == (128, 256) and whole._windows() == (256,)
    lengths = []
    for message in ("hello there", "the quiet river " * 20):
        request = ChatRequest(message, greedy=greedy, seed=5, max_new_tokens=64)
        a, b = engine.reply(request), whole.reply(request)
        assert (a.answer, a.stats.new_tokens, a.stats.bucket) == (b.answer, b.stats.new_tokens, b.stats.bucket)
        lengths.append(a.stats.bucket + a.stats.new_tokens)
    assert min(lengths) <= 128 < max(lengths)  # one reply stayed in window 128, one crossed into 256


def test_the_cache_keeps_its_tensors_and_reads_a_slice(demo_models):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(demo_models.chat)
    cache = WindowedStaticCache(config, 256, (128,))
    cache.select(8)
    k = torch.randn(1, config.num_key_value_heads, 8, config.head_dim)
    keys, values = cache.layers[0].update(k, k.clone())
    assert keys.shape[2] == 128 and cache.layers[0].keys.shape[2] == 256
    assert keys.data_ptr() == cache.layers[0].keys.data_ptr()  # a view: the static address is unchanged
    assert torch.equal(keys[:, :, :8], k) and cache.get_mask_sizes(1, 0) == (128, 0)


def test_windows_are_warmed_up_only_where_a_new_shape_compiles(windowed, demo_models):
    engine = make_engine(windowed, demo_models.chat)  # CPU, eager: nothing to compile
    assert not engine.placement.new_shapes_compile
    seen = record_windows(engine)
    engine.warm_up(PromptBucket(32))
    assert seen == [128, 128]  # one prefill and one decode step, no extra run per window


@pytest.mark.slow
def test_a_reset_cache_keeps_old_entries_but_never_reads_them(windowed, demo_models):
    """After a long reply the cache still holds its entries (not zeroed); the next reply is the same
    as on a fresh engine, because every position it attends to was written by itself."""
    used = make_engine(windowed, demo_models.chat)
    fresh = make_engine(windowed, demo_models.chat)
    long = used.reply(ChatRequest("the quiet river " * 20, greedy=True, max_new_tokens=64))
    assert long.stats.bucket + long.stats.new_tokens > 128  # it wrote past window 128
    layer = used._cache(1).layers[0]
    assert layer.keys[:, :, 130].abs().sum() > 0 and int(layer.cumulative_length) == 0
    for request in (ChatRequest("hello there", greedy=True, max_new_tokens=40),
                    ChatRequest("a short one", greedy=False, seed=3, max_new_tokens=40)):
        a, b = used.reply(request), fresh.reply(request)
        assert (a.answer, a.stats.new_tokens) == (b.answer, b.stats.new_tokens)
