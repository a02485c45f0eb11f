"""Compiled prefill on static chunks (--prefill-chunk): cache windows, declared graphs, replies as eager prefill."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from support.window_probe import record_windows

from neuron_backend.chat import static_cache
from neuron_backend.chat.engine import ChatEngine, ChatRequest, _Prompt
from neuron_backend.devices import CompileCounter, HostDevices, resolve_placements
from neuron_backend.errors import ConfigError
from neuron_backend.settings import parse_settings
from neuron_backend.shapes import PromptBucket
from tools.chat_batch import plugin as chat_batch
from tools.chat_batch.batch import BatchRow, Sampling


def make_engine(settings, folder, rows: int = 1) -> ChatEngine:
    """The chat engine of --chat-batch ``rows`` (the plug-in's batch, as app.py hands it over)."""
    batch = chat_batch.plug(settings.replace(options={"chat_batch": rows})).chat_batch
    engine = ChatEngine(settings, resolve_placements(settings, HostDevices(0, None, 0))["chat"], "demo Qwen3",
                        batch=batch)
    engine.load(folder)
    return engine


@pytest.fixture
def windowed(tiny_settings):
    """The tiny preset (buckets 32, 64, 128; context 256) with a cache window of 64: windows (64, 256)."""
    return tiny_settings.replace(cache_windows=(64,))


def prompt_ids(engine: ChatEngine, length: int) -> tuple[list[int], int]:
    """``length`` token ids and the bucket they pad to."""
    ids = engine.tokenizer(" the" * length, add_special_tokens=False)["input_ids"][:length]
    assert len(ids) == length
    return ids, min(b for b in engine.buckets if b >= length)


def warm_up(engine: ChatEngine) -> list[int]:
    """Warm every bucket up in order; the graphs each one compiled."""
    counts = []
    for key in engine.shapes.keys():
        before = CompileCounter.graphs()
        engine.warm_up(key)
        counts.append(CompileCounter.graphs() - before)
    return counts


# ----- settings and plan ------------------------------------------------------------------------------
def test_chunk_defaults_to_the_largest_that_divides_every_bucket():
    tiny, full = ["--models", "tiny"], ["--models", "full"]
    assert parse_settings(tiny, env={}).prefill_chunk_tokens == 64  # the demo preset's buckets 64, 256, 1024, 3072
    assert parse_settings(full, env={}).prefill_chunk_tokens == 64
    assert parse_settings([*tiny, "--chat-buckets", "48,128"], env={}).prefill_chunk_tokens == 16
    assert parse_settings(tiny, env={"SHOWCASE_PREFILL_CHUNK": "16"}).prefill_chunk_tokens == 16
    assert parse_settings([*tiny, "--prefill-chunk", "auto"], env={}).prefill_chunk_tokens == 64
    for off in ("0", "off"):
        assert parse_settings([*tiny, "--prefill-chunk", off], env={}).prefill_chunk_tokens == 0
    # auto follows the buckets of a copy
    assert parse_settings(tiny, env={}).replace(buckets=(48, 96)).prefill_chunk_tokens == 48


@pytest.mark.parametrize(("value", "problem"), [
    ("48", "48 does not divide bucket 64 of --chat-buckets .*e.g. 64 .*0 for eager prefill"),
    ("-8", "is negative"),
    ("big", "not a whole number"),
])
def test_a_bad_chunk_is_refused_with_what_is_allowed(value, problem):
    with pytest.raises(ConfigError, match=f"--prefill-chunk: .*{problem}") as info:
        parse_settings(["--models", "tiny", "--prefill-chunk", value], env={})
    assert info.value.flag == "--prefill-chunk"


def test_the_chunk_graphs_are_declared_by_buckets_and_windows():
    full_windows = (512, 1024, 2048, 4096)
    assert static_cache.graph_windows(64, 64, full_windows) == (512,)
    assert static_cache.graph_windows(1024, 64, full_windows) == (512, 1024)
    assert static_cache.graph_windows(3072, 64, full_windows) == full_windows  # 3072 > 2048: the last chunks read 4096
    assert static_cache.graph_windows(128, 32, (64, 256)) == (64, 256)
    # the full preset: 4 decode graphs + 4 chunk graphs, the most dynamo keeps per function by default (8)
    assert static_cache.recompile_limit(full_windows, (64, 256, 1024, 3072), 64) == 8
    assert static_cache.recompile_limit(full_windows, (64, 256, 1024, 3072), 0) == 4
    assert static_cache.label(128, 32, (64, 256)) == "compiled prefill: 4 chunks of 32 tokens over windows 64, 256"
    assert static_cache.label(32, 32, (64, 256)) == "compiled prefill: 1 chunk of 32 tokens over window 64"


def test_chunks_only_where_the_forward_is_compiled(windowed, demo_models):
    eager = ChatEngine(windowed, resolve_placements(windowed, HostDevices(0, None, 0))["chat"], "demo")
    on = windowed.replace(compile="on")
    compiled = ChatEngine(on, resolve_placements(on, HostDevices(0, None, 0))["chat"], "demo")
    off = windowed.replace(compile="on", prefill_chunk=0)
    unchunked = ChatEngine(off, resolve_placements(off, HostDevices(0, None, 0))["chat"], "demo")
    assert (eager.prefill_chunk, compiled.prefill_chunk, unchunked.prefill_chunk) == (0, 32, 0)
    assert "eager prefill" in eager.shape_labels[PromptBucket(128)]
    assert "eager prefill" in unchunked.shape_labels[PromptBucket(128)]
    assert "4 chunks of 32 tokens over windows 64, 256" in compiled.shape_labels[PromptBucket(128)]
    assert "decode graphs" in compiled.shape_labels[PromptBucket(32)]


# ----- windows under chunked prefill (eager: the same code path, no compile) --------------------------
def generate(engine: ChatEngine, ids: list[int], bucket: int, chunk: int, max_new: int, floor: int = 0) -> list[int]:
    """The engine's own generate() call for a greedy reply, with prefill chunks of ``chunk`` (0: none)."""
    prompt = _Prompt(ids, bucket, 0, max_new, False, floor)
    kwargs = engine._generate_kwargs(ChatRequest("x", greedy=True, max_new_tokens=max_new), prompt,
                                     threading.Event(), None, max_new)
    if chunk:
        kwargs["prefill_chunk_size"] = chunk
    return engine.model.generate(**kwargs)[0, bucket:].tolist()


def test_each_chunk_attends_over_the_window_of_the_whole_sequence_so_far(windowed, demo_models):
    """Chunks ending at 32, 64, 96, 128 need windows 64, 64, 256, 256, not the window of a chunk's
    own length (32 -> 64 every time, which dropped the keys of positions 64.. from the last chunks)."""
    engine = make_engine(windowed, demo_models.chat)
    ids, bucket = prompt_ids(engine, 100)
    assert bucket == 128
    seen = record_windows(engine)
    chunked = generate(engine, ids, bucket, 32, 6)
    assert seen == [64, 64, 256, 256] + [256] * 5
    seen.clear()
    whole = generate(engine, ids, bucket, 0, 6)
    assert seen == [256] * 6
    assert chunked == whole


def test_a_floor_raises_decode_windows_and_no_chunk(windowed, demo_models):
    engine = make_engine(windowed, demo_models.chat)
    ids, bucket = prompt_ids(engine, 40)  # bucket 64: chunks end at 32 and 64, both in window 64
    seen = record_windows(engine)
    generate(engine, ids, bucket, 32, 3, floor=256)
    assert seen == [64, 64, 256, 256]


# ----- compiled: graphs only in warm-up, replies as eager prefill ------------------------------------------
@pytest.mark.slow
def test_compiled_chunks_compile_only_in_warm_up_and_reply_as_eager_prefill(windowed, demo_models):
    """Every prompt length from 1 to the largest bucket (exact bucket lengths included: no padding),
    replies that cross from window 64 into 256, greedy and seeded sampling: no compile after warm-up,
    and the same tokens as the eager prefill with the same compiled decode."""
    settings = windowed.replace(compile="on")
    chunked, eager = make_engine(settings, demo_models.chat), make_engine(settings.replace(prefill_chunk=0),
                                                                          demo_models.chat)
    torch._dynamo.reset()
    # bucket 32: its chunk (window 64) and the decode graphs of windows 64 and 256; bucket 64 reuses the
    # chunk graph; bucket 128's last two chunks read window 256
    assert warm_up(chunked) == [3, 0, 1]
    assert warm_up(eager) == [2, 0, 0]  # decode graphs only
    seen = record_windows(chunked)
    before = CompileCounter.graphs()
    with torch.compiler.set_stance("fail_on_recompile"):
        for length, max_new in zip(range(1, 129), itertools.cycle([1, 2, 40, 7]), strict=False):
            ids, bucket = prompt_ids(chunked, length)
            max_new = min(max_new, 256 - bucket)
            request = ChatRequest("x", greedy=length % 2 == 0, seed=length, max_new_tokens=max_new)
            a, b = (list(e._run(request, _Prompt(ids, bucket, 0, max_new, False)))[-1] for e in (chunked, eager))
            assert a.stats.compiled_graphs == 0 and b.stats.compiled_graphs == 0
            assert (a.answer, a.stats.new_tokens, a.stats.finish_reason) == (
                b.answer, b.stats.new_tokens, b.stats.finish_reason), length
    assert CompileCounter.graphs() == before
    assert set(seen) == {64, 256}


@pytest.mark.slow
def test_compiled_chunks_at_batch_n_compile_only_in_warm_up(windowed, demo_models):
    """--chat-batch 4: [4, 32] chunks and [4, 1] decode steps; batches of 1 to 4 real rows (padding rows
    for the rest) of every prompt length; the same tokens per row as the eager prefill."""
    settings = windowed.replace(compile="on")
    chunked, eager = make_engine(settings, demo_models.chat, 4), make_engine(settings.replace(prefill_chunk=0),
                                                                             demo_models.chat, 4)
    torch._dynamo.reset()
    assert warm_up(chunked) == [3, 0, 1]
    assert warm_up(eager) == [2, 0, 0]
    lengths, groups = iter(range(1, 129)), []
    for size in itertools.cycle([1, 4, 2, 3]):
        group = list(itertools.islice(lengths, size))
        if not group:
            break
        groups.append(group)
    before = CompileCounter.graphs()
    with torch.compiler.set_stance("fail_on_recompile"):
        for n, group in enumerate(groups):
            results = []
            for engine in (chunked, eager):
                rows = []
                for length in group:
                    ids, bucket = prompt_ids(engine, length)
                    max_new = min((3, 40, 1)[n % 3], 256 - max(prompt_ids(engine, g)[1] for g in group))
                    rows.append(BatchRow(ids, bucket, max_new, Sampling(greedy=True)))
                engine.runner().scheduler.run(rows)
                assert all(r.result is not None and r.result.compiled_graphs == 0 for r in rows), group
                results.append([r.result.new_ids for r in rows])
            assert results[0] == results[1], group
    assert CompileCounter.graphs() == before
