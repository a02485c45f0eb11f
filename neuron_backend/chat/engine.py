"""The chat engine: Qwen3 through ``generate()`` with static shapes, streaming, thinking and cancel.

Prompts are left-padded to the smallest bucket that fits; one static KV cache of ``settings.context_length``
tokens serves every reply. One generation at a time (``SerialJobs``), on the engine's one generate thread; the
others wait in line. How the shapes and the reply's path fit together: docs/architecture.md, "The chat engine".
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    CompileConfig,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)
from transformers.utils import is_accelerate_available

from .. import devices
from ..devices import CompileCounter, GraphFallbacks, Placement, on_device, synchronize
from ..errors import ConfigError, EngineUnavailableError, InvalidRequestError
from ..messages import joined, tr
from ..plugins import ChatBatch, Sharding, wrap_compiled
from ..settings import Settings
from ..shapes import PromptBucket, SerialJobs, ShapeRegistry, shape_keys
from . import static_cache
from .prompt import Prompt as _Prompt
from .prompt import PromptBuilder
from .static_cache import WindowedStaticCache, attach, declared, window_for
from .text import (
    SAMPLING_DEFAULTS,
    ChatRequest,
    ChatStats,
    ChatUpdate,
    HistoryLimits,
    PromptInfo,
    ThinkSplitter,
    normalize_request,
    strip_reasoning,
)

__all__ = ["ChatEngine", "ChatRequest", "ChatStats", "ChatUpdate", "PromptInfo", "ThinkSplitter", "strip_reasoning"]

STREAM_POLL_S = 0.5  # streamer queue timeout: how often a waiting consumer checks the worker is alive


class ChatEngine:
    """Chat with a causal LM on one placement. Safe to call from many request threads."""

    name = "chat"

    def __init__(self, settings: Settings, placement: Placement, model_id: str, compiled: tuple = (),
                 batch: ChatBatch | None = None, sharding: Sharding | None = None):
        """``compiled``: the plug-ins' wrappers of the compiled forward (``Parts.compiled``); ``batch``: replies
        served N at a time by its runner (``Parts.chat_batch``); None: one at a time; ``sharding``: the keywords
        that load this rank's shard where ``placement.tp`` is above 1 (``Parts.sharding``)."""
        self.settings, self.placement, self.model_id = settings, placement, model_id
        self.buckets = tuple(settings.buckets)
        self.shapes = ShapeRegistry(self.name, shape_keys(settings, self.name))
        self.prefill_chunk = static_cache.chunk_size(settings, placement.compile)  # 0: eager prefill (static_cache.py)
        # labels are messages (English as str): the status panel can show them in the page's language
        self.shape_labels = {key: tr("prompt bucket {bucket} tokens, {prefill}", bucket=key.tokens,
                                     prefill=static_cache.label(key.tokens, self.prefill_chunk, self._windows()))
                             for key in self.shapes.keys()}
        first = PromptBucket(self.buckets[0])
        windows = ", ".join(str(w) for w in self._windows())
        self.shape_labels[first] = tr("{shape} + the decode graphs (cache {context} tokens, windows {windows})",
                                      shape=self.shape_labels[first],
                                       context=settings.context_length, windows=windows)
        self._caches: dict[int, WindowedStaticCache] = {}  # by batch size: one per engine in practice
        self.graphs = GraphFallbacks(placement)  # the compiled graphs that failed on Neuron (warm_up)
        self.model = self.tokenizer = None
        self._prompts: PromptBuilder | None = None  # made by load()
        self.jobs = SerialJobs()
        self._thread: GenerateThread | None = None  # made by load() (or on first use, under the job lock)
        # a batch of N > 1 rows: every shape is warmed up and served at batch N, by the batch's runner
        self._batch, self.rows = batch, 1 if batch is None else batch.rows
        self._runner, self._runner_lock = None, threading.Lock()  # made on first use, after load()
        if self.rows > 1:
            self.shape_labels = {k: tr("{shape}, batch {batch}", shape=v, batch=self.rows)
                                 for k, v in self.shape_labels.items()}
        self._sharding = sharding
        # Tensor parallel only (set by Sharding.attach on rank 0, by the followers' loop): on_generate is
        # called under the job lock before generate() with (request, prompt, min_new_tokens, seed); agree_stop
        # turns this rank's stop into rank 0's, after every token. Single-process, both stay None.
        self.on_generate = None
        self.agree_stop: Callable[[bool], bool] | None = None
        self._compile_config = None
        self._wrappers = compiled
        self.saved_forwards = None  # the handle a wrapper returned for the compiled forward (load); None: none took it
        if placement.compile:
            self._compile_config = CompileConfig(
                backend=placement.compile_backend, fullgraph=True, dynamic=False, mode="default"
            )
            # generate() auto-compiles only on cuda/xpu/neuron/tpu; this private flag (read by
            # _valid_auto_compile_criteria) lets the same path run on CPU. A no-op elsewhere.
            self._compile_config._compile_all_devices = True

    # ----- loading and warm-up ---------------------------------------------------------------
    def load(self, folder: Path) -> None:
        """Load tokenizer and model from a local folder onto the placement's explicit device."""
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        if not tokenizer.chat_template:
            raise EngineUnavailableError(tr("The chat model in {folder} has no chat template; use an instruct model.",
                                            folder=folder))
        if self.placement.tp > 1:  # one shard per torchrun rank, on this rank's device (Parts.sharding)
            where = self._sharding.load_kwargs(self.name, self.placement)
        else:  # device_map needs accelerate; without it, load on CPU and move (same result, more host memory)
            where = {"device_map": self.placement.device} if is_accelerate_available() else {}
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=self.placement.dtype, trust_remote_code=False,
                                                     **where)
        if self.placement.tp == 1:
            model = model.to(self.placement.device)
        model = model.eval()
        positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if positions is not None and positions < self.settings.context_length:
            raise ConfigError("--context-length", f"{self.settings.context_length} exceeds what the model supports",
                              f"at most {positions}")
        eos = model.generation_config.eos_token_id
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [tokenizer.eos_token_id])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        attach(model)  # generate() picks the cache window before every forward (static_cache.py)
        if self.placement.compile:  # a decode step reads the cache in place; chunks build their masks (static_cache.py)
            static_cache.use_compiled_attention(model, static_masks=bool(self.prefill_chunk))
            # generate() calls model.get_compiled_call for its compiled forward: a wrapper may replace it
            self.saved_forwards = wrap_compiled(
                self._wrappers, self.name, model, self._compile_config.to_dict(), self.placement, self.settings,
                variant=repr(bool(self.prefill_chunk)))
        if self.prefill_chunk:  # the chunks run compiled: one graph each, whatever the prompt (static_cache.py)
            wanted = static_cache.recompile_limit(self._windows(), self.buckets, self.prefill_chunk) + 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, wanted)
        self.tokenizer, self.model = tokenizer, model
        self._prompts = PromptBuilder(tokenizer, self.buckets, self.settings.context_length)
        self._generate_thread()  # now, not in the first reply: it is a thread for the engine's lifetime

    def warm_up(self, shape: PromptBucket) -> None:
        """Generate two tokens at this bucket (the first bucket also compiles every window's decode graph); mark it
        ready, or failed and re-raise. A graph that failed to compile on Neuron is left out per graph, and
        ``shapes.eager[shape]`` says which and why (docs/trainium.md, "Eager fallback, per graph")."""
        if shape not in self.shape_labels:
            raise InvalidRequestError(tr("Unknown chat shape {shape}; allowed: {allowed}.", shape=repr(str(shape)),
                                          allowed=", ".join(map(str, self.shape_labels))))
        bucket = shape.tokens
        try:
            self._require_loaded()
            ids = self._prompts.encode(self._prompts.render(None, [], "Hello", thinking=False))[-bucket:]
            # The first bucket also compiles the decode graph of every cache window (a floor makes
            # the second token decode over it), so no reply of any length compiles later.
            floors = [0]
            if bucket == self.buckets[0] and self.placement.new_shapes_compile:
                windows = self._windows()
                floors += [w for w in windows if w > window_for(windows, bucket + 1)]
            request = ChatRequest("Hello", greedy=True, max_new_tokens=2)

            def attempt():
                for floor in floors:
                    if self.rows > 1:  # [N, bucket] prefill and the [N, 1] decode graphs
                        self.runner().warm_up(ids, bucket, floor)
                        continue
                    prompt = _Prompt(ids, bucket, 0, 2, False, floor)
                    for _ in self._run(request, prompt, min_new_tokens=2):  # min: eos must not skip the decode step
                        pass

            compiled = self.graphs.warm_up(shape, self._plans(bucket), attempt)
            if note := self._fallback_note(bucket, compiled):
                self.shapes.eager[shape] = note
        except Exception as exc:
            self.shapes.mark_failed(shape, f"{type(exc).__name__}: {exc}")
            raise
        self.shapes.mark_ready(shape)

    # ----- requests ------------------------------------------------------------------------------
    def validate(self, request: ChatRequest | Mapping, allow_empty: bool = False) -> ChatRequest:
        """Check and normalise a request, filling the sampling defaults of its mode."""
        s = self.settings
        limits = HistoryLimits(s.max_history_messages, s.max_history_chars, s.max_prompt_chars)
        return normalize_request(request, s.max_prompt_chars, s.max_new_tokens, allow_empty, limits)

    def stream(self, request: ChatRequest | Mapping, stop: threading.Event | None = None) -> Iterator[ChatUpdate]:
        """Validate, fit the prompt into a bucket, then stream the reply (the last update has stats).

        Raises InvalidRequestError/PromptTooLongError/ShapeNotReadyError before anything runs. Closing the
        iterator early cancels the generation. ``stop``, set, ends this reply (only this row in a batch) within
        one token, and the stream still ends with its final update; ``cancel()`` stops whatever reply runs."""
        request = self.validate(request)
        self._require_loaded()
        prompt = self._prepare(request)
        key = PromptBucket(prompt.bucket)
        self.shapes.require(key, self.shape_labels[key])
        if self.rows > 1:
            return self.runner().stream(request, prompt, stop)
        return self._run(request, prompt, stop=stop)

    def reply(self, request: ChatRequest | Mapping) -> ChatUpdate:
        """Run a whole reply and return its final update."""
        final = None
        for final in self.stream(request):  # noqa: B007 - only the last update is kept
            pass
        return final

    def cancel(self) -> bool:
        """Stop the running reply (in a batch: every reply of the running batch) within one token."""
        return self.jobs.cancel()

    @property
    def busy(self) -> bool:
        return self.jobs.busy

    def count_prompt_tokens(self, request: ChatRequest | Mapping) -> PromptInfo:
        """Token count, bucket and dropped turns of a draft (the message may be empty)."""
        request = self.validate(request, allow_empty=True)
        self._require_loaded()
        ids, dropped = self._prompts.fit(request)
        largest, context = self.buckets[-1], self.settings.context_length
        if len(ids) > largest:
            problem = self._prompts.too_long_message(len(ids), request)
            return PromptInfo(len(ids), None, dropped, largest, context, 0, False, problem)
        bucket = next(b for b in self.buckets if len(ids) <= b)
        room = min(self.settings.max_new_tokens, context - bucket)
        return PromptInfo(len(ids), bucket, dropped, largest, context, room, True)

    def describe(self) -> dict:
        """Plain data for the UI."""
        shapes = self.shapes.snapshot()
        for key in self.shapes.keys():
            shapes[key.label]["label"] = self.shape_labels[key]
        return {
            "name": self.name, "model_id": self.model_id, "placement": self.placement.label(),
            "loaded": self.model is not None, "busy": self.busy, "buckets": list(self.buckets),
            "chat_batch": self.rows,
            "context_length": self.settings.context_length, "cache_windows": list(self._windows()),
            "max_new_tokens": self.settings.max_new_tokens,
            "max_prompt_chars": self.settings.max_prompt_chars, "shapes": shapes,
            "defaults": {mode: dict(values) for mode, values in SAMPLING_DEFAULTS.items()},
        }

    # ----- prompt -----------------------------------------------------------------------------------
    def _require_loaded(self) -> None:
        if self.model is None:
            raise EngineUnavailableError(tr("The chat model is not loaded yet; try again shortly."))

    def _prepare(self, request: ChatRequest) -> _Prompt:
        return self._prompts.prepare(request)

    # ----- generation -------------------------------------------------------------------------------
    def _generate_kwargs(self, request: ChatRequest, prompt: _Prompt, cancelled, streamer, min_new: int) -> dict:
        pad = prompt.bucket - len(prompt.ids)
        # input_ids, attention_mask: [1, bucket], left-padded (mask 0 on padding)
        ids = torch.tensor([[self.pad_id] * pad + prompt.ids], device=self.placement.input_device)
        mask = torch.tensor([[0] * pad + [1] * len(prompt.ids)], device=self.placement.input_device)
        kwargs = dict(
            input_ids=ids, attention_mask=mask, streamer=streamer, pad_token_id=self.pad_id,
            stopping_criteria=StoppingCriteriaList([CancelCriteria(cancelled, self.agree_stop)]),
            max_new_tokens=prompt.max_new_tokens, min_new_tokens=min_new or None,
            cache=self._cache(1, prompt.window_floor), do_sample=not request.greedy,
        )
        if not request.greedy:  # passed only when sampling: generate() warns about unused flags
            kwargs.update(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k)
        return {**kwargs, **self._compile_kwargs(prompt.bucket)}

    def _compile_kwargs(self, bucket: int) -> dict:
        """generate() flags of the compile choice: compiled decode, and compiled prefill chunks if on,
        less the graphs that failed on Neuron (the bucket's plan, chosen by its warm-up)."""
        if self._compile_config is None:
            return {"disable_compile": True}
        full = self._plans(bucket)[0]
        compiled = self.graphs.compiled(PromptBucket(bucket), full)
        if not compiled:  # a decode graph failed: no compiled call at all
            return {"disable_compile": True}
        chunked = {"prefill_chunk_size": self.prefill_chunk} if self.prefill_chunk and compiled == full else {}
        return {"compile_config": self._compile_config, **chunked}

    def _plans(self, bucket: int) -> list[frozenset]:
        """The graphs this bucket may run compiled, most first: prefill chunks and decode, decode alone, none."""
        windows = self._windows()
        decode = static_cache.decode_graphs(bucket, windows)
        return [static_cache.prefill_graphs(bucket, self.prefill_chunk, windows) | decode, decode, frozenset()]

    def _fallback_note(self, bucket: int, compiled: frozenset) -> str | None:
        """Which of this bucket's graphs failed to compile, why, and how the bucket runs now (None: none failed)."""
        ordered = sorted(self._plans(bucket)[0], key=lambda g: (g.tokens == 1, g))  # prefill chunks first
        failed = {g: self.graphs.failed[g] for g in ordered if g in self.graphs.failed}
        if not failed:
            return None
        errors = {error: [g.label for g in failed if failed[g] == error] for error in dict.fromkeys(failed.values())}
        why = joined([tr("{graphs} failed to compile ({error})", graphs=joined(graphs), error=error)
                      for error, graphs in errors.items()], "{a}; {b}")
        runs = tr("the prefill runs eager, the decode compiled") if compiled else \
            tr("the prefill and the decode run eager")
        return tr("{runs}: {why}", runs=runs, why=why)

    def _windows(self) -> tuple[int, ...]:
        return declared(self.settings.cache_windows, self.settings.context_length)

    def _cache(self, batch: int, floor: int = 0) -> WindowedStaticCache:
        """The engine's static cache for this batch size, emptied for the next generate() (under the job lock)."""
        cache = self._caches.get(batch)
        if cache is None:
            cache = self._caches[batch] = WindowedStaticCache(self.model.config, self.settings.context_length,
                                                              self.settings.cache_windows)
            if self.prefill_chunk:
                static_cache.early_init(cache, self.model, batch)
        cache.reset()
        cache.floor = floor
        return cache

    def _generate_thread(self) -> GenerateThread:
        if self._thread is None:
            self._thread = GenerateThread(self.placement)  # its device context for its whole life
            weakref.finalize(self, self._thread.stop)  # the thread ends when the engine is collected
        return self._thread

    def _run(self, request: ChatRequest, prompt: _Prompt, min_new_tokens: int = 0,
             follower: bool = False, stop: threading.Event | None = None) -> Iterator[ChatUpdate]:
        """Generate under the job lock, streaming updates; the final update is yielded after the lock is freed.

        ``stop`` becomes the job's cancel event: set, even before the job starts, it ends this reply.
        """
        splitter = ThinkSplitter(prompt.starts_in_reasoning, tags=prompt.thinking)
        with self.jobs.job(stop) as cancelled:
            graphs_before = CompileCounter.graphs()
            seed = None if request.greedy else (request.seed if request.seed is not None else secrets.randbits(32))
            if self.on_generate is not None and not follower:  # tensor parallel: followers run the same call
                self.on_generate((request, prompt, min_new_tokens, seed))
            if seed is not None:
                torch.manual_seed(seed)  # inside the lock: no other reply draws from the generator meanwhile
            streamer = TimedStreamer(self.tokenizer, skip_prompt=True, timeout=STREAM_POLL_S,
                                      skip_special_tokens=True)
            worker = Worker(self.model, self._generate_kwargs(request, prompt, cancelled, streamer, min_new_tokens),
                             streamer)
            started = time.perf_counter()
            worker.start(self._generate_thread())
            finished = False
            try:
                for chunk in chunks(streamer, worker):
                    delta = splitter.feed(chunk)
                    if delta:
                        yield ChatUpdate(splitter.reasoning, splitter.answer, delta, False, None, prompt.dropped_turns)
                finished = True
            finally:
                if not finished:  # the consumer closed the stream early: stop generating, within one token
                    cancelled.set()
                worker.join()
            if worker.error is not None:
                raise worker.error
            synchronize(self.placement)
            ended = time.perf_counter()
            new_ids = worker.output[0, prompt.bucket :].tolist()
            stats = self._stats(prompt, new_ids, cancelled.is_set(), started, streamer.first_token_at, ended,
                                CompileCounter.graphs() - graphs_before, seed)
        delta = splitter.finish()
        yield ChatUpdate(splitter.reasoning, splitter.answer, delta, True, stats, prompt.dropped_turns)

    def _stats(self, prompt, new_ids, cancelled, started, first, ended, graphs, seed) -> ChatStats:
        decode_s = ended - first if first is not None else 0.0
        # A natural end wins over a cancel that arrived just after it.
        if new_ids and new_ids[-1] in self.eos_ids:
            reason = "eos"
        elif len(new_ids) >= prompt.max_new_tokens or not cancelled:
            reason = "length"
        else:
            reason = "stopped"
        return ChatStats(
            prompt_tokens=len(prompt.ids), bucket=prompt.bucket, new_tokens=len(new_ids),
            time_to_first_token_s=None if first is None else first - started,
            tokens_per_s=(len(new_ids) - 1) / decode_s if len(new_ids) > 1 and decode_s > 0 else 0.0,
            total_s=ended - started, compiled_graphs=graphs, dropped_turns=prompt.dropped_turns,
            context_length=self.settings.context_length, max_new_tokens=prompt.max_new_tokens,
            stopped=reason == "stopped", finish_reason=reason, seed=seed,
        )

    # ----- many users: a batch of N > 1 rows (Parts.chat_batch) --------------------------------------
    def runner(self):
        """The batch's runner of this engine, made on first use (it needs the loaded tokenizer and model)."""
        with self._runner_lock:
            if self._runner is None:
                self._runner = self._batch.runner(self)
            return self._runner

    def generate_rows(self, window_floor: int = 0, **kwargs) -> torch.Tensor:
        """model.generate for the runner: the engine's static cache of N rows and its compile choice."""
        batch = kwargs["input_ids"].shape[0]
        kwargs.update(pad_token_id=self.pad_id, cache=self._cache(batch, window_floor),
                      **self._compile_kwargs(kwargs["input_ids"].shape[1]))
        with on_device(self.placement):  # the runner's thread, or the warm-up thread (devices.on_device)
            return self.model.generate(**kwargs)


class CancelCriteria(StoppingCriteria):
    """Reads a threading.Event after every token: generate() stops within one token once it is set."""

    def __init__(self, event: threading.Event, agree: Callable[[bool], bool] | None = None):
        self.event, self.agree = event, agree  # agree: tensor parallel, every rank stops at rank 0's token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        stop = self.event.is_set()
        if self.agree is not None:
            stop = self.agree(stop)
        # one flag per sequence: [B]
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class TimedStreamer(TextIteratorStreamer):
    """A TextIteratorStreamer that notes when the first new token arrived (text may come later)."""

    first_token_at: float | None = None

    def put(self, value: torch.Tensor) -> None:
        if not self.next_tokens_are_prompt and self.first_token_at is None:  # the first put() is the prompt
            self.first_token_at = time.perf_counter()
        super().put(value)


class GenerateThread:
    """One long-lived daemon thread that runs an engine's generate() calls, one after another, and ends with its
    engine; named ``BUSY_NAME`` only while a generate() runs. Why not a thread per reply: docs/performance.md,
    "2. Chat overhead"."""

    BUSY_NAME, IDLE_NAME = "chat-generate", "chat-generate (idle)"

    def __init__(self, placement=None) -> None:
        """``placement``: the thread selects its device for its whole life (``devices.on_device``)."""
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        target = self._serve if placement is None else devices.bound(placement, self._serve)
        self._thread = threading.Thread(target=target, args=(self._jobs,), name=self.IDLE_NAME, daemon=True)
        self._thread.start()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            job()
            del job  # keep no finished reply alive while idle

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def stop(self, wait_s: float = 5.0) -> None:
        """End the thread and wait for it (at most ``wait_s``): the engine's finalizer calls this, also at
        interpreter exit, where a thread that ran torch and is still alive aborts the process
        ("terminate called without an active exception", SIGABRT; seen once in a torchrun rank)."""
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(wait_s)


class Worker:
    """One generate() call on the generate thread; keeps its output or its exception; always ends the streamer."""

    def __init__(self, model, kwargs: dict, streamer):
        self.model, self.kwargs, self.streamer = model, kwargs, streamer
        self.output: torch.Tensor | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    def start(self, thread: GenerateThread) -> None:
        thread.submit(self.run)

    def run(self) -> None:
        thread = threading.current_thread()
        thread.name = GenerateThread.BUSY_NAME
        try:
            self.output = self.model.generate(**self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer thread, which re-raises it
            self.error = exc
            self.streamer.end()  # wake the consumer now rather than at its next poll
        finally:
            thread.name = GenerateThread.IDLE_NAME  # before done: whoever waited sees it idle
            self._done.set()

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self) -> None:
        self._done.wait()


def chunks(streamer, worker: Worker) -> Iterator[str]:
    """Text from the streamer until it ends; its timeout only makes us check the worker is alive."""
    while True:
        try:
            yield next(streamer)
        except StopIteration:
            return
        except queue.Empty:
            if not worker.is_alive() and streamer.text_queue.empty():
                return
