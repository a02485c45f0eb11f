"""The chat engine on the tiny demo Qwen3 (CPU): static shapes, truncation, thinking, cancel, compile."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch

from neuron_backend.chat.engine import ChatEngine, ChatRequest, ThinkSplitter, _Prompt, strip_reasoning
from neuron_backend.devices import CompileCounter, HostDevices, resolve_placements
from neuron_backend.errors import InvalidRequestError, PromptTooLongError, ShapeNotReadyError
from neuron_backend.shapes import PromptBucket

CPU_ONLY = HostDevices(neuron_cores=0, cuda_devices=0)
LONG = "the quiet river " * 20  # about 60 tokens of demo words


def make_engine(settings, folder) -> ChatEngine:
    placement = resolve_placements(settings, CPU_ONLY)["chat"]
    engine = ChatEngine(settings, placement, "demo Qwen3")
    engine.load(folder)
    return engine


@pytest.fixture
def engine(tiny_settings, demo_models):
    return make_engine(tiny_settings, demo_models.chat)


class ForwardLog:
    """Records every forward call of the model (input_ids) and can act at the n-th call."""

    def __init__(self, model, at: int | None = None, action=None):
        self.calls: list[torch.Tensor] = []
        self.at, self.action = at, action
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.calls.append(kwargs["input_ids"].clone())
        if len(self.calls) == self.at:
            self.action()

    def remove(self):
        self.handle.remove()


def generate_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chat-generate"]


# ----- static shapes ------------------------------------------------------------------------------
@pytest.mark.slow
def test_prefill_sees_only_bucket_lengths_left_padded(engine):
    log = ForwardLog(engine.model)
    seen = {}
    for message in ("hi", "the quiet river " * 8, LONG):
        log.calls.clear()
        final = engine.reply(ChatRequest(message, greedy=True, max_new_tokens=4))
        prefill, decodes = log.calls[0], log.calls[1:]
        bucket, real = final.stats.bucket, final.stats.prompt_tokens
        assert prefill.shape == (1, bucket)
        assert bucket == min(b for b in engine.buckets if b >= real)
        pad = bucket - real
        assert prefill[0, :pad].tolist() == [engine.tokenizer.pad_token_id] * pad  # LEFT padding
        assert engine.tokenizer.decode(prefill[0, pad:]).startswith("<|im_start|>user")
        assert all(d.shape == (1, 1) for d in decodes)
        seen[bucket] = real
    log.remove()
    assert sorted(seen) == [32, 64, 128]


def test_left_padding_does_not_change_the_logits(engine):
    """Padded to a bucket by the engine or not padded at all: the same logits, prefill and decode."""
    logits = []
    hook = engine.model.register_forward_hook(lambda m, args, out: logits.append(out.logits[0, -1].clone()))
    final = engine.reply(ChatRequest("hi", greedy=True, max_new_tokens=3))
    hook.remove()
    assert final.stats.bucket - final.stats.prompt_tokens >= 2 and final.stats.new_tokens == 3
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                add_generation_prompt=True, enable_thinking=False)
    ids = engine.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    ref = engine.model.generate(ids, do_sample=False, max_new_tokens=3, min_new_tokens=3, output_logits=True,
                                return_dict_in_generate=True, disable_compile=True)
    for got, want in zip(logits, ref.logits, strict=True):  # attending to padding would shift them by ~1e-2
        torch.testing.assert_close(got, want[0], atol=1e-5, rtol=1e-4)


def test_max_new_tokens_is_capped_by_the_fixed_context(tiny_settings, demo_models):
    engine = make_engine(tiny_settings.replace(context_length=150), demo_models.chat)
    final = engine.reply(ChatRequest(LONG, greedy=True, max_new_tokens=64))
    assert final.stats.bucket == 128
    assert final.stats.max_new_tokens == 150 - 128
    assert final.stats.new_tokens <= 22
    assert engine.count_prompt_tokens({"message": LONG}).max_new_tokens == 22


# ----- long conversations ------------------------------------------------------------------------
def test_long_history_drops_the_oldest_turns(engine):
    history = []
    for i in range(12):
        history += [{"role": "user", "content": f"question {i} the river"},
                    {"role": "assistant", "content": f"answer {i} the stone"}]
    log = ForwardLog(engine.model)
    final = engine.reply(ChatRequest("latest words", history=history, system_prompt="be brief", greedy=True,
                                     max_new_tokens=2))
    log.remove()
    dropped = final.stats.dropped_turns
    assert 0 < dropped < 12 and final.dropped_turns == dropped
    prompt = engine.tokenizer.decode(log.calls[0][0], skip_special_tokens=False)
    assert "be brief" in prompt and "latest words" in prompt  # never dropped
    assert f"question {dropped - 1} " not in prompt and f"question {dropped} " in prompt  # the oldest went
    assert final.stats.prompt_tokens <= 128
    # As few as possible: keeping one more turn would not have fitted the largest bucket.
    one_more = [{"role": "system", "content": "be brief"}, *history[2 * (dropped - 1):],
                {"role": "user", "content": "latest words"}]
    rendered = engine.tokenizer.apply_chat_template(one_more, add_generation_prompt=True, enable_thinking=False,
                                                    tokenize=False)
    assert len(engine.tokenizer(rendered, add_special_tokens=False)["input_ids"]) > 128


def test_single_message_too_long_names_the_limit(engine):
    with pytest.raises(PromptTooLongError, match=r"longest prompt this server accepts is 128 tokens"):
        engine.stream(ChatRequest("the quiet river " * 60))
    info = engine.count_prompt_tokens({"message": "the quiet river " * 60})
    assert not info.fits and info.bucket is None and "128 tokens" in info.problem


# ----- thinking ------------------------------------------------------------------------------------
TEXT = "<think>\nstep one\nstep two\n</think>\n\nThe answer is 42."


def split_all(chunks, in_reasoning=False, tags=True):
    splitter = ThinkSplitter(in_reasoning, tags)
    deltas = [splitter.feed(c) for c in chunks] + [splitter.finish()]
    return splitter.reasoning, splitter.answer, "".join(deltas)


@pytest.mark.parametrize("cut", range(len(TEXT) + 1))
def test_splitter_any_two_chunks(cut):
    # the deltas joined are exactly reasoning + answer: no stray whitespace where a part begins
    assert split_all([TEXT[:cut], TEXT[cut:]]) == ("step one\nstep two", "The answer is 42.",
                                                    "step one\nstep twoThe answer is 42.")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_splitter_fixed_chunk_sizes(size):
    chunks = [TEXT[i:i + size] for i in range(0, len(TEXT), size)]
    assert split_all(chunks)[:2] == ("step one\nstep two", "The answer is 42.")


def test_splitter_edge_cases():
    assert split_all(["a < b and <", "thin", "g>"])[:2] == ("", "a < b and <thing>")
    assert split_all(["plain answer"])[:2] == ("", "plain answer")
    assert split_all(["<think>unfinished"])[:2] == ("unfinished", "")
    assert split_all(["reasoned</thi", "nk>answer"])[:2] == ("reasoned", "answer")  # open tag was in the prompt
    assert split_all(["reasoned</think>answer"], in_reasoning=True)[:2] == ("reasoned", "answer")
    assert split_all(["<think></think>", "\n\nhi"])[:2] == ("", "hi")


def test_think_tags_are_text_where_they_mean_nothing():
    # thinking off: the template closed the think block in the prompt; tags the model writes are text
    assert split_all(["<think>a</think>b"], tags=False)[:2] == ("", "<think>a</think>b")
    assert split_all(["Use </th", "ink> to close"], tags=False)[:2] == ("", "Use </think> to close")
    # thinking on: only a <think> that opens the reply, and the first </think>, are markers
    assert split_all(["<think>a</think>b <think>c</think>"])[:2] == ("a", "b <think>c</think>")
    assert split_all(["An answer with <th", "ink>x</think> in it"])[:2] == ("", "An answer with <think>x</think> in it")


def test_streamed_deltas_have_no_leading_space_the_answer_lacks():
    splitter = ThinkSplitter(tags=False)
    deltas = [splitter.feed(c) for c in (" hello", " world", " ")] + [splitter.finish()]
    assert deltas[0] == "hello" and "".join(deltas) == splitter.answer == "hello world"


def test_strip_reasoning_follows_the_official_template():
    assert strip_reasoning("<think>\nsecret\n</think>\n\nvisible") == "visible"
    assert strip_reasoning("secret</think>visible") == "visible"
    assert strip_reasoning("  indented\n    code\n\n") == "  indented\n    code\n\n"  # whitespace kept


def test_enable_thinking_reaches_the_template_and_old_reasoning_is_dropped(engine):
    log = ForwardLog(engine.model)
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>secret</think>visible"}]
    prompts = {}
    for thinking in (False, True):
        log.calls.clear()
        final = engine.reply(ChatRequest("hello", history=history, thinking=thinking, greedy=True, max_new_tokens=2))
        prompts[thinking] = engine.tokenizer.decode(log.calls[0][0, -final.stats.prompt_tokens:])
    log.remove()
    assert prompts[False].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompts[True].endswith("<|im_start|>assistant\n")
    assert all("visible" in p and "secret" not in p for p in prompts.values())


# ----- cancel, errors, threads ----------------------------------------------------------------------
def test_cancel_stops_within_one_token_and_frees_the_engine(engine):
    log = ForwardLog(engine.model, at=3, action=engine.cancel)  # cancel while computing token 3
    final = engine.reply(ChatRequest("hello", greedy=True, max_new_tokens=40, seed=1))
    log.remove()
    assert final.done and final.stats.stopped and final.stats.finish_reason == "stopped"
    assert final.stats.new_tokens == 3
    assert not engine.busy and not engine.cancel()
    again = engine.reply(ChatRequest("hello", max_new_tokens=5, seed=1))
    assert not again.stats.stopped and again.stats.new_tokens >= 1


def test_cancel_from_the_consumer_side(engine):
    slow = engine.model.register_forward_pre_hook(lambda *args: time.sleep(0.01))
    stream = engine.stream(ChatRequest("hello", max_new_tokens=64, seed=2))
    next(stream)
    assert engine.busy and engine.cancel()  # what the UI's stop button calls
    final = list(stream)[-1]
    slow.remove()
    assert final.stats.finish_reason == "stopped" and final.stats.new_tokens < 64
    assert not engine.busy and not generate_threads()


def test_closing_the_stream_early_ends_the_thread(engine):
    before = {t.ident for t in threading.enumerate()}
    slow = engine.model.register_forward_pre_hook(lambda *args: time.sleep(0.01))  # the worker is mid-reply
    log = ForwardLog(engine.model)
    stream = engine.stream(ChatRequest("hello", max_new_tokens=64, seed=3))
    first = next(stream)
    assert not first.done and first.delta
    stream.close()  # what Gradio does when the user presses stop or leaves
    slow.remove()
    log.remove()
    assert not generate_threads() and {t.ident for t in threading.enumerate()} <= before
    assert not engine.busy
    assert len(log.calls) < 20  # stopped early, not run on to max_new_tokens


def test_generate_error_reaches_the_consumer_without_hanging(engine):
    def boom():
        raise RuntimeError("boom in forward")

    log = ForwardLog(engine.model, at=2, action=boom)
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="boom in forward"):
        engine.reply(ChatRequest("hello", max_new_tokens=10, seed=0))
    assert time.perf_counter() - start < 5
    log.remove()
    assert not generate_threads() and not engine.busy
    assert engine.reply(ChatRequest("hello", max_new_tokens=3, seed=0)).done


def test_concurrent_callers_all_finish_with_their_own_reply(engine):
    messages = ["hello", "the garden", "quiet blue window " * 4]
    expected = {m: engine.reply(ChatRequest(m, seed=11, max_new_tokens=12)).answer for m in messages}
    results, errors, overlap = {}, [], []

    def slow_and_count(*args):
        overlap.append(len(generate_threads()))
        time.sleep(0.003)  # long enough for the callers to queue up

    hook = engine.model.register_forward_pre_hook(slow_and_count)

    def call(message):
        try:
            results[message] = engine.reply(ChatRequest(message, seed=11, max_new_tokens=12)).answer
        except Exception as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(m,)) for m in messages]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    hook.remove()
    assert not errors and results == expected
    assert max(overlap) == 1  # one generation at a time; the others waited
    assert not generate_threads()


# ----- stats, sampling controls -----------------------------------------------------------------------
def test_stats_of_a_reply(engine):
    updates = list(engine.stream(ChatRequest("hello world", seed=5, max_new_tokens=16)))
    final = updates[-1]
    assert final.done and all(not u.done and u.stats is None for u in updates[:-1])
    assert "".join(u.delta for u in updates).strip() == final.answer
    s = final.stats
    info = engine.count_prompt_tokens({"message": "hello world"})
    assert (s.prompt_tokens, s.bucket, s.dropped_turns) == (info.prompt_tokens, info.bucket, 0)
    assert s.context_length == 256 and s.max_new_tokens == 16 and s.seed == 5
    assert 1 <= s.new_tokens <= 16 and s.finish_reason in ("eos", "length") and not s.stopped
    assert s.finish_reason == "eos" or s.new_tokens == 16
    assert 0 < s.time_to_first_token_s <= s.total_s and s.tokens_per_s >= 0
    assert s.compiled_graphs == 0  # eager


def test_seed_makes_sampled_replies_reproducible(engine):
    replies = [engine.reply(ChatRequest("hello", seed=seed, max_new_tokens=30)).answer for seed in (42, 42, 43)]
    assert replies[0] == replies[1] != replies[2]
    unseeded = engine.reply(ChatRequest("hello", max_new_tokens=30))
    assert engine.reply(ChatRequest("hello", seed=unseeded.stats.seed, max_new_tokens=30)).answer == unseeded.answer


def test_sampling_controls_reach_generate(engine):
    greedy = engine.reply(ChatRequest("hello", greedy=True, max_new_tokens=20))
    assert greedy.stats.seed is None
    top1 = engine.reply(ChatRequest("hello", top_k=1, seed=9, max_new_tokens=20))
    assert top1.answer == greedy.answer


def test_validate_fills_the_defaults_of_each_mode(engine):
    chat = engine.validate({"message": "  hi\x00\x07 there\n\tend  "})
    assert chat.message == "hi there\n\tend"
    assert (chat.temperature, chat.top_p, chat.top_k, chat.max_new_tokens) == (0.7, 0.8, 20, 64)
    think = engine.validate(ChatRequest("hi", thinking=True, history=[{"role": "user", "content": "a", "x": 1}]))
    assert (think.temperature, think.top_p, think.top_k) == (0.6, 0.95, 20)
    assert think.history == ({"role": "user", "content": "a"},)


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ({"message": "   "}, "empty"),
        ({"message": 5}, "must be text"),
        ({"message": "x" * 20_001}, "at most 20000"),
        ({"history": "hi"}, '"role": "user" or "assistant"'),
        ({"history": [{"role": "system", "content": "x"}]}, '"role": "user" or "assistant"'),
        ({"history": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, "only text parts"),
        ({"history": [{"role": "user", "content": 5}]}, "text or a list of text parts"),
        ({"history": 5}, "must be a list of"),
        ({"history": [{"role": "user", "content": "x"}] * 201}, "201 messages; this server accepts at most 200"),
        ({"history": [{"role": "user", "content": "x" * 20_000}] * 6}, "at most 100000"),
        ({"message": "bad \ud800 text"}, "lone surrogate"),
        ({"system_prompt": "\udfff"}, "lone surrogate"),
        ({"temperature": 0}, "from 0.01 to 2"),
        ({"temperature": 1e-300}, r"from 0.01 to 2\. .*use greedy"),
        ({"temperature": 2.5}, "from 0.01 to 2"),
        ({"temperature": 10**5000}, r"from 0.01 to 2, not a whole number of about 50\d\d digits"),
        ({"temperature": "0.7"}, "from 0.01 to 2"),
        ({"temperature": True}, "from 0.01 to 2"),
        ({"top_p": 1.5}, "above 0 and at most 1"),
        ({"top_k": -1}, "whole number from 0 to 1000"),
        ({"top_k": 2.0}, "whole number from 0 to 1000"),
        ({"seed": 10**5000}, r"from 0 to 4294967295, not a whole number of about 50\d\d digits"),
        ({"max_new_tokens": 0}, "from 1 to 64"),
        ({"max_new_tokens": 65}, "from 1 to 64"),
        ({"max_new_tokens": True}, "from 1 to 64"),
        ({"seed": -1}, "from 0 to 4294967295"),
        ({"seed": 2**32}, "from 0 to 4294967295"),
        ({"seed": "1"}, "from 0 to 4294967295"),
        ({"thinking": "yes"}, "true or false"),
        ({"colour": "red"}, "allowed: message, history"),
    ],
)
def test_invalid_requests_say_what_is_allowed(engine, change, allowed):
    with pytest.raises(InvalidRequestError, match=allowed):
        engine.stream({"message": "hello", **change})


def test_gating_refuses_buckets_not_yet_warmed(engine):
    engine.shapes.gated = True
    with pytest.raises(ShapeNotReadyError, match="still warming up"):
        engine.stream(ChatRequest("hello"))
    engine.warm_up(PromptBucket(32))
    assert engine.reply(ChatRequest("hello", max_new_tokens=2)).done
    with pytest.raises(ShapeNotReadyError) as info:
        engine.stream(ChatRequest(LONG))
    assert info.value.shape == "prefill-128"
    assert "decode graphs" in engine.describe()["shapes"]["prefill-32"]["label"]


# ----- compile -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_compiled_decode_never_recompiles_after_warm_up(tiny_settings, demo_models):
    """One decode graph per cache window (64, 256) for every prompt length and max_new_tokens, all
    compiled during the first warm-up; replies cross from window 64 into 256 without compiling (a prompt of
    bucket 64 fills window 64 exactly, its first new token decodes over 256)."""
    # the eager prefill (--prefill-chunk 0); tests/core/test_prefill.py covers the compiled prefill chunks. Its
    # window (64) is test_prefill.py's: the same two decode graphs, which inductor's cache then holds (seconds,
    # not a minute, on 2 cores)
    settings = tiny_settings.replace(compile="on", cache_windows=(64,), prefill_chunk=0)
    engine = make_engine(settings, demo_models.chat)
    assert engine.placement.compile and engine.placement.compile_backend == "inductor"
    torch._dynamo.reset()
    counts = []
    for key in engine.shapes.keys():
        before = CompileCounter.graphs()
        engine.warm_up(key)
        counts.append(CompileCounter.graphs() - before)
    assert engine._windows() == (64, 256)
    assert counts == [2, 0, 0]  # a decode graph per window; prefill is eager
    before = CompileCounter.graphs()
    lengths = [1, 2, 31, 32, 33, 64, 65, 100, 127, 128]
    with torch.compiler.set_stance("fail_on_recompile"):
        for length, max_new in zip(lengths, itertools.cycle([1, 2, 7, 64]), strict=False):
            prompt_ids = engine.tokenizer(" the" * length, add_special_tokens=False)["input_ids"][:length]
            prompt = _Prompt(prompt_ids, min(b for b in engine.buckets if b >= length), 0, max_new, False)
            final = list(engine._run(ChatRequest("x", max_new_tokens=max_new, seed=length), prompt))[-1]
            assert final.stats.compiled_graphs == 0 and final.stats.bucket >= length
        for message, greedy in (("hi", True), ("the quiet river " * 8, False), (LONG, False)):
            final = engine.reply(ChatRequest(message, greedy=greedy, seed=1, max_new_tokens=64))
            assert final.stats.compiled_graphs == 0
    assert CompileCounter.graphs() == before
