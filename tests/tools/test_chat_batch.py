"""Many chat users (--chat-batch N, tools/chat_batch): one generate() over N fixed rows, per-row streaming and stop
(tiny Qwen3, CPU)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from support.app import app_parts, app_settings

from neuron_backend.chat.engine import ChatEngine, ChatRequest
from neuron_backend.devices import CompileCounter, HostDevices, resolve_placements
from neuron_backend.errors import ConfigError
from tools.chat_batch import plugin as chat_batch

CPU_ONLY = HostDevices(neuron_cores=0, cuda_devices=0)
# Prompts of every tiny bucket (32, 64, 128 tokens), each with its own max_new_tokens.
PROMPTS = {"hello": 9, "the garden": 14, "quiet blue window " * 6: 20, "the quiet river " * 20: 24}


def make_engine(settings, folder, rows: int = 1, gather_s: float | None = None) -> ChatEngine:
    """The chat engine of --chat-batch ``rows``, with the plug-in's batch as app.py hands it over."""
    batch = chat_batch.plug(settings.replace(options={"chat_batch": rows})).chat_batch
    engine = ChatEngine(settings, resolve_placements(settings, CPU_ONLY)["chat"], "demo Qwen3", batch=batch)
    engine.load(folder)
    if gather_s is not None:  # the batch starts once N requests wait, or after this long
        engine.runner().scheduler.gather_s = gather_s
    return engine


@pytest.fixture
def single(tiny_settings, demo_models):
    return make_engine(tiny_settings, demo_models.chat)


@pytest.fixture
def batched(tiny_settings, demo_models):
    return make_engine(tiny_settings, demo_models.chat, rows=4, gather_s=5.0)


class Forwards:
    """Every forward call's input_ids and last-position logits, and the 2D attention mask of each generate()."""

    def __init__(self, model, delay: float = 0.0):
        self.ids: list[torch.Tensor] = []  # [N, bucket] at a prefill, [N, 1] when decoding
        self.logits: list[torch.Tensor] = []  # [N, vocab]
        self.masks: list[torch.Tensor] = []  # [N, bucket], one per generate() call
        self.delay, self.model = delay, model
        self.handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                        model.register_forward_hook(self._post)]
        generate = model.generate

        def spy(**kwargs):
            self.masks.append(kwargs["attention_mask"].clone())
            return generate(**kwargs)

        model.generate = spy  # an instance attribute: remove() deletes it

    def _pre(self, module, args, kwargs):
        if torch.compiler.is_compiling():  # the compiled decode graph: not logged (no side effects in it)
            return
        self.ids.append(kwargs["input_ids"].clone())
        time.sleep(self.delay)

    def _post(self, module, args, out):
        if torch.compiler.is_compiling():
            return
        self.logits.append(out.logits[:, -1].clone())

    def remove(self):
        for handle in self.handles:
            handle.remove()
        del self.model.generate


def concurrently(engine: ChatEngine, requests: dict[str, ChatRequest]) -> dict:
    """Send every request from its own thread at once; return each final update (or exception)."""
    results = {}

    def call(name, request):
        try:
            results[name] = engine.reply(request)
        except Exception as exc:  # noqa: BLE001 - checked by the caller
            results[name] = exc

    threads = [threading.Thread(target=call, args=item) for item in requests.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return results


def scheduler_threads(wait_s: float = 5.0) -> list[threading.Thread]:
    """The batch scheduler threads still alive after ``wait_s`` (one ends once the line is empty)."""
    deadline = time.perf_counter() + wait_s
    while True:
        alive = [t for t in threading.enumerate() if t.name == "chat-batch"]
        if not alive or time.perf_counter() > deadline:
            return alive
        time.sleep(0.01)


def greedy(message: str) -> ChatRequest:
    return ChatRequest(message, greedy=True, max_new_tokens=PROMPTS.get(message, 16))


# ----- one batch, same text as alone -------------------------------------------------------------------
def test_four_concurrent_replies_match_the_single_path(single, batched):
    expected = {m: single.reply(greedy(m)) for m in PROMPTS}
    log = Forwards(batched.model)
    results = concurrently(batched, {m: greedy(m) for m in PROMPTS})
    log.remove()
    assert len(log.ids) == max(PROMPTS.values())  # ONE generate(): a prefill, then decode steps
    assert log.ids[0].shape == (4, 128) and all(ids.shape == (4, 1) for ids in log.ids[1:])
    for message, want in expected.items():
        got = results[message]
        assert got.answer == want.answer and got.reasoning == want.reasoning
        s = got.stats
        assert (s.new_tokens, s.finish_reason) == (want.stats.new_tokens, want.stats.finish_reason)
        assert s.new_tokens == PROMPTS[message] or s.finish_reason == "eos"  # each row stops at its own limit
        assert (s.bucket, s.batch_size, s.max_new_tokens, s.prompt_tokens) == (128, 4, PROMPTS[message],
                                                                                 want.stats.prompt_tokens)
        assert s.queued_s >= 0 and 0 < s.time_to_first_token_s <= s.total_s and s.seed is None
    for row in range(4):  # every row left-padded to the batch's bucket
        real = int(log.masks[0][row].sum())
        assert log.ids[0][row, : 128 - real].eq(batched.pad_id).all() and log.masks[0][row, : 128 - real].eq(0).all()
    assert not scheduler_threads()  # no thread that ran torch outlives the requests


def test_padding_rows_leave_the_real_rows_exact(single, tiny_settings, demo_models):
    """Two requests in a batch of 4: two padding rows; every real row's logits equal the single path's."""
    batched = make_engine(tiny_settings, demo_models.chat, rows=4, gather_s=0.5)
    messages = ["hello", "the quiet river " * 8]  # buckets 32 and 64: the short one is padded to 64
    alone = {}
    for message in messages:
        log = Forwards(single.model)
        alone[message] = (single.reply(greedy(message)), torch.stack([lg[0] for lg in log.logits]))
        log.remove()
    log = Forwards(batched.model)
    results = concurrently(batched, {m: greedy(m) for m in messages})
    log.remove()
    assert log.ids[0].shape == (4, 64)
    pad_rows = [r for r in range(4) if log.masks[0][r].sum() == 1]
    assert len(pad_rows) == 2 and all(log.ids[0][r].eq(batched.pad_id).all() for r in pad_rows)
    for message in messages:
        final, logits = alone[message]
        assert results[message].answer == final.answer and results[message].stats.bucket == 64
        row = next(r for r in range(4) if r not in pad_rows and log.masks[0][r].sum() == final.stats.prompt_tokens)
        steps = final.stats.new_tokens
        batched_logits = torch.stack([lg[row] for lg in log.logits[:steps]])
        torch.testing.assert_close(batched_logits, logits[:steps], atol=1e-4, rtol=1e-4)


# ----- per-user stop -----------------------------------------------------------------------------------
def test_one_user_stopping_does_not_disturb_the_others(single, batched):
    expected = {m: single.reply(greedy(m)).answer for m in PROMPTS}
    quitter = "the quiet river " * 20  # 24 new tokens asked, the longest
    log = Forwards(batched.model, delay=0.01)  # slow enough that the stop lands mid-reply
    closed = {}

    def stop_early():
        stream = batched.stream(greedy(quitter))
        closed["first"] = next(stream)
        stream.close()  # what Gradio does when this user presses stop

    others = {m: greedy(m) for m in PROMPTS if m != quitter}
    thread = threading.Thread(target=stop_early)
    thread.start()
    results = concurrently(batched, others)
    thread.join(timeout=60)
    log.remove()
    assert not closed["first"].done
    for message in others:
        assert results[message].answer == expected[message] and not results[message].stats.stopped
    real = batched.count_prompt_tokens(greedy(quitter)).prompt_tokens
    row = next(r for r in range(4) if log.masks[0][r].sum() == real)
    decoded = [ids[row, 0].item() for ids in log.ids[1:]]
    stopped_at = next(i for i, token in enumerate(decoded) if token == batched.pad_id)
    assert stopped_at < PROMPTS[quitter] - 2 and all(t == batched.pad_id for t in decoded[stopped_at:])
    assert len(log.ids) == max(PROMPTS[m] for m in others)  # the batch ran on for the others


def test_engine_cancel_stops_the_whole_batch_and_errors_reach_every_row(batched):
    log = Forwards(batched.model, delay=0.01)
    # Cancel once every row is decoding (a timer could fire before the batch starts on a busy host, and the
    # rows would then run to their limit): the hook notes it, another thread cancels, as a visitor's Stop does.
    decoding = threading.Event()

    def note(module, args, kwargs):
        if tuple(log.ids[-1].shape) == (len(PROMPTS), 1):
            decoding.set()

    noted = batched.model.register_forward_pre_hook(note, with_kwargs=True)
    canceller = threading.Thread(target=lambda: decoding.wait(60) and batched.cancel())
    canceller.start()
    results = concurrently(batched, {m: ChatRequest(m, greedy=True, max_new_tokens=64) for m in PROMPTS})
    canceller.join()
    noted.remove()
    log.remove()
    assert decoding.is_set()
    assert all(r.stats.finish_reason in ("stopped", "eos") for r in results.values())
    assert len(log.ids) < 64
    deadline = time.perf_counter() + 5  # a row's final update may come just before generate() returns
    while batched.busy and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert not batched.busy

    def boom(*args):
        raise RuntimeError("boom in forward")

    hook = batched.model.register_forward_pre_hook(boom)
    started = time.perf_counter()
    results = concurrently(batched, {m: greedy(m) for m in PROMPTS})
    hook.remove()
    assert time.perf_counter() - started < 10
    assert all(isinstance(r, RuntimeError) and "boom" in str(r) for r in results.values())
    batched.runner().scheduler.gather_s = 0.05
    assert batched.reply(greedy("hello")).done  # the scheduler lives on


# ----- sampling and seeds --------------------------------------------------------------------------------
@pytest.mark.slow
def test_seeded_request_runs_alone_and_is_reproducible(batched):
    seeded = ChatRequest("hello", seed=42, max_new_tokens=24)
    unseeded = {f"u{i}": ChatRequest(m, max_new_tokens=12) for i, m in enumerate(["hello", "the garden"])}
    batched.runner().scheduler.gather_s = 0.3
    log = Forwards(batched.model)
    results = concurrently(batched, {"seeded": seeded, **unseeded, "greedy": greedy("hello")})
    log.remove()
    real_rows = sorted(int((mask.sum(dim=1) > 1).sum()) for mask in log.masks)
    assert real_rows == [1, 1, 2]  # seeded alone, greedy apart, the two same-sampling requests together
    assert results["seeded"].stats.seed == 42 and results["seeded"].stats.batch_size == 4
    assert all(results[k].stats.seed is None for k in unseeded)  # shared RNG: no seed reproduces them
    again = [batched.reply(seeded).answer for _ in range(2)]
    assert again == [results["seeded"].answer] * 2
    assert batched.reply(ChatRequest("hello", seed=43, max_new_tokens=24)).answer != again[0]
    alone = batched.reply(ChatRequest("hello", max_new_tokens=24))  # sampled and alone: its seed reproduces it
    assert batched.reply(ChatRequest("hello", seed=alone.stats.seed, max_new_tokens=24)).answer == alone.answer


@pytest.mark.slow
def test_a_script_may_exit_right_after_a_batched_reply(demo_models, tmp_path):
    """A thread that ran torch and outlives the interpreter aborts the process; the scheduler's must not."""
    script = (
        "import torch; torch.set_num_threads(1)\n"
        "from neuron_backend.chat.engine import ChatEngine\n"
        "from neuron_backend.devices import HostDevices, resolve_placements\n"
        "from neuron_backend.settings import parse_settings\n"
        "from tools.chat_batch import plugin\n"
        f"s = parse_settings(['--models', 'tiny', '--device', 'cpu', '--chat-batch', '2', '--cache-dir', "
        f"{str(tmp_path)!r}], env={{}}, plugins=(plugin,))\n"
        "batch = plugin.plug(s).chat_batch\n"
        "engine = ChatEngine(s, resolve_placements(s, HostDevices(0, 0))['chat'], 'demo', batch=batch)\n"
        f"engine.load({str(demo_models.chat)!r})\n"
        "print(engine.reply({'message': 'hello', 'greedy': True, 'max_new_tokens': 3}).stats.batch_size)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr[-2000:]
    assert "terminate called" not in done.stderr


# ----- settings ------------------------------------------------------------------------------------------------
def rows(argv, env=None) -> int:
    """The chat's rows as app.py gets them: its plug-ins' flags parsed, their parts merged."""
    return app_parts(app_settings(argv, env)).chat_rows


def test_chat_batch_setting():
    base = ["--models", "tiny", "--device", "cpu"]
    assert rows(base) == 1 and app_parts(app_settings(base)).chat_batch is None  # 1: the single path, no batch
    assert rows(base, env={"SHOWCASE_CHAT_BATCH": "4"}) == 4
    assert rows([*base, "--chat-batch", "16"], env={"SHOWCASE_CHAT_BATCH": "4"}) == 16
    for value, problem in (("0", "out of range"), ("17", "out of range"), ("two", "not a whole number")):
        with pytest.raises(ConfigError, match=f"--chat-batch: .*{problem}") as info:
            rows([*base, "--chat-batch", value])
        assert info.value.flag == "--chat-batch"
    with pytest.raises(ConfigError, match=r"--chat-batch: .*--tp"):
        rows([*base, "--chat-batch", "2", "--tp", "2"], env={"WORLD_SIZE": "2"})


# ----- compile ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_compiled_batch_never_recompiles_after_warm_up(tiny_settings, demo_models):
    """Warm-up runs [4, bucket] prefills and the [4, 1] decode graphs (windows 64, 256); later batches compile
    nothing."""
    # the eager prefill (--prefill-chunk 0); tests/core/test_prefill.py covers the compiled prefill chunks. Its
    # window (64) is test_prefill.py's: the same two decode graphs, which inductor's cache then holds
    settings = tiny_settings.replace(compile="on", cache_windows=(64,), prefill_chunk=0)
    engine = make_engine(settings, demo_models.chat, rows=4, gather_s=0.3)
    torch._dynamo.reset()
    log = Forwards(engine.model)
    counts = []
    for key in engine.shapes.keys():
        before = CompileCounter.graphs()
        engine.warm_up(key)
        counts.append(CompileCounter.graphs() - before)
    assert counts == [2, 0, 0]  # a decode graph per cache window; prefill is eager
    assert sorted({tuple(ids.shape) for ids in log.ids}) == [(4, 32), (4, 64), (4, 128)]  # eager prefills
    log.remove()
    engine.shapes.gated = True
    before = CompileCounter.graphs()
    with torch.compiler.set_stance("fail_on_recompile"):
        for _ in range(2):  # a full batch, then the same requests split by sampling and seed
            results = concurrently(engine, {m: greedy(m) for m in PROMPTS})
            assert all(r.stats.compiled_graphs == 0 and r.stats.batch_size == 4 for r in results.values())
            mixed = {"seeded": ChatRequest("hello", seed=1, max_new_tokens=8), "sampled": ChatRequest("the garden"),
                     "long": greedy("the quiet river " * 20)}
            results = concurrently(engine, mixed)
            assert all(r.stats.compiled_graphs == 0 for r in results.values())
    assert CompileCounter.graphs() == before


# ----- the plug-in's seam ----------------------------------------------------------------------------------------
SINGLE_THEN_BATCHED = """
import sys
from support.app import app_backend, app_settings

args = ["--models", "tiny", "--device", "cpu", "--no-image", "--cache-dir", sys.argv[1], "--chat-buckets", "32",
        "--context-length", "256", "--max-new-tokens", "3"]


def reply(backend):
    backend.runner.run()
    return list(backend.stream_chat({"message": "hello", "history": [], "greedy": True}))[-1]


single = reply(app_backend(app_settings(args)))  # as app.py: every plug-in, no --chat-batch
assert single.done and single.stats.batch_size == 1
assert "tools.chat_batch.batch" not in sys.modules, "a single-reply chat imported the batch module"
batched = reply(app_backend(app_settings([*args, "--chat-batch", "2"])))
assert batched.done and batched.stats.batch_size == 2 and "tools.chat_batch.batch" in sys.modules
print("ok")
"""


@pytest.mark.slow
def test_a_single_reply_chat_never_imports_the_batch_module(demo_models, tmp_path):
    from support.app import link_demo_models, run_fresh

    link_demo_models(tmp_path / "root", demo_models)
    run_fresh(SINGLE_THEN_BATCHED, str(tmp_path / "root"))
