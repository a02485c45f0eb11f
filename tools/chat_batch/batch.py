"""Many chat users on one device: N fixed batch slots, one ``generate()`` per batch (``--chat-batch N``).

``BatchRunner`` is what the chat engine calls (``Parts.chat_batch``): it warms up a shape at batch N and streams
one reply from a slot of a shared batch; ``BatchScheduler`` forms and runs the batches.

Static shapes (one compiled graph per input shape) make the batch size part of every graph, so a batch is always
exactly N rows: the eager prefill only sees ``[N, bucket]`` and the decode graphs are ``[N, 1]``
(one per cache window, static_cache.py) against the one static cache of ``context_length`` tokens.
Rows are LEFT-padded to the batch's bucket (the largest bucket of its rows: the smallest that fits
the longest prompt); an empty slot holds a padding row (all pad ids, attention only on its last
token, so its logits stay finite and sampling never sees NaN) that is marked finished at once and
whose output is discarded.

How a batch forms: ``submit`` puts a request in line. The scheduler thread waits until ``GATHER_S``
after the oldest waiting request arrived (or until N can go), then takes the oldest and up to N-1
later requests that can share its ``generate()`` call: the same sampling parameters (generate takes
one set per call), no explicit seed, and a ``max_new_tokens`` that still fits the cache at the
batch's bucket. The others wait for a later batch, the oldest first, so nobody starves.
No joining mid-batch: a request that arrives while a batch runs waits for the next one. transformers'
continuous batching (``generate_batch``) could add it, but it uses paged attention and variable
shapes, untested on Neuron.

Per row: a streamer receives the ``[N]`` new ids of each step and hands each live row its own token,
decoded by the row's own ``TextStreamer`` logic (the same word-boundary hold-back as the single
path, so the text is identical); a stopping criterion returns ``[N]`` flags, True for padding rows
and rows that ended (eos, the row's own ``max_new_tokens``, its own cancel event). generate() pads
finished rows and ends when every row is done; a row's final update is sent as soon as it ends.

Seeds: the rows of a batch share one RNG, so a sampled reply in a shared batch cannot be
reproduced from a seed (its stats report none). A request with an explicit seed runs alone (its
row first, N-1 padding rows), and a sampled request that happened to run alone reports the seed
that reproduces it.

Concurrency: ``submit`` and ``follow`` are called from request threads; one thread runs the batches
while requests wait and ends when the line is empty (``submit`` starts the next one), so no thread
that ran torch outlives the requests (one still alive at interpreter exit aborts the process with
"terminate called without an active exception"). Every ``generate()`` holds the engine's
``SerialJobs`` lock (warm-up shares it), so ``ChatEngine.cancel()`` stops the whole running batch,
while closing one ``follow`` iterator stops only that row.
"""

from __future__ import annotations

import atexit
import queue
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer
from transformers.generation.streamers import BaseStreamer

from neuron_backend.chat.text import ChatRequest, ChatUpdate, ThinkSplitter
from neuron_backend.devices import CompileCounter, synchronize
from neuron_backend.errors import EngineUnavailableError
from neuron_backend.messages import tr
from neuron_backend.shapes import SerialJobs

GATHER_S = 0.02  # how long the oldest waiting request waits for company before its batch starts
POLL_S = 0.5  # a waiting consumer checks the scheduler thread is alive this often
_TEXT, _DONE, _ERROR = "text", "done", "error"


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters generate() takes once per call; rows share a batch only when equal."""

    greedy: bool
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    @classmethod
    def of(cls, request) -> Sampling:
        """From a validated ChatRequest; greedy ignores the others, so all greedy requests are equal."""
        if request.greedy:
            return cls(True)
        return cls(False, request.temperature, request.top_p, request.top_k)

    def generate_kwargs(self) -> dict:
        if self.greedy:  # sampling flags are passed only when sampling: generate() warns about unused ones
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


@dataclass(frozen=True)
class BatchModel:
    """What the scheduler needs from the chat engine."""

    generate: Callable[..., torch.Tensor]  # model.generate with the engine's static cache and compile settings
    tokenizer: Any
    pad_id: int
    eos_ids: frozenset[int]
    input_device: str  # where generate() inputs live (CPU on Neuron)
    synchronize: Callable[[], None]


@dataclass(frozen=True)
class RowResult:
    """How one row's reply went; the engine turns it into ChatStats."""

    new_ids: list[int]  # this row's tokens only (no padding after it ended)
    finish_reason: str  # "eos" | "length" | "stopped"
    bucket: int  # the padded prompt length of the batch
    batch_size: int  # N: the rows of the generate() call, padding rows included
    shared_with: int  # real requests in that batch, this one included
    queued_s: float  # from submit to the start of its generate()
    started: float  # perf_counter at the start of its generate()
    first_token_at: float | None
    ended: float
    compiled_graphs: int  # graphs compiled between the batch's start and this row's end
    seed: int | None  # the seed that reproduces this reply (None: greedy, or sampled in a shared batch)


class BatchRow:
    """One request in one slot: its prompt, its own stop event, and the queue its text arrives on.

    ``cancel`` stops only this row (within one token once it runs; a waiting row is dropped).
    The underscored fields are written by the thread that runs the batch.
    """

    def __init__(self, ids: list[int], bucket: int, max_new_tokens: int, sampling: Sampling, seed: int | None = None):
        self.ids, self.bucket, self.max_new_tokens = list(ids), bucket, max_new_tokens
        self.sampling, self.seed = sampling, seed
        self.cancel = threading.Event()
        self.submitted = time.perf_counter()
        self.result: RowResult | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()  # (kind, value): text chunks, then done or error
        self._new_ids: list[int] = []
        self._limit: int | None = None  # how many new tokens this row keeps, once it has ended
        self._reason: str | None = None
        self._first: float | None = None
        self._text: _RowText | None = None


class _RowText(TextStreamer):
    """The single path's incremental decoding (word-boundary hold-back), sending text to one row's queue."""

    def __init__(self, tokenizer, events: queue.SimpleQueue):
        super().__init__(tokenizer, skip_prompt=False, skip_special_tokens=True)
        self.events = events

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self.events.put((_TEXT, text))


class _RowCriteria(StoppingCriteria):
    """Per-row stop, read after every token: [N] flags, True for padding rows and rows that ended."""

    def __init__(self, slots: list[BatchRow | None], bucket: int, eos_ids: frozenset[int],
                 stop_all: threading.Event):
        self.slots, self.bucket, self.eos_ids, self.stop_all = slots, bucket, eos_ids, stop_all

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        count = input_ids.shape[1] - self.bucket  # new tokens so far; input_ids: [N, bucket + count]
        last = input_ids[:, -1].tolist()
        for row, token in zip(self.slots, last, strict=True):
            if row is None or row._limit is not None:
                continue
            # A natural end wins over a cancel that arrived at the same step (as on the single path).
            if token in self.eos_ids:
                row._reason = "eos"
            elif count >= row.max_new_tokens:
                row._reason = "length"
            elif row.cancel.is_set() or self.stop_all.is_set():
                row._reason = "stopped"
            if row._reason is not None:
                row._limit = count  # this step's token is still the row's own
        done = [row is None or row._limit is not None for row in self.slots]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)  # [N]


class _RowStreamer(BaseStreamer):
    """Takes the [N] new ids of each step: each live row gets its token; a row that ended is finished."""

    def __init__(self, slots: list[BatchRow | None], finish: Callable[[BatchRow], None]):
        self.slots, self.finish = slots, finish
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # the first put() is the prompt: [N, bucket]
            self.prompt_seen = True
            return
        now = time.perf_counter()
        for row, token in zip(self.slots, value.tolist(), strict=True):  # value: [N]
            if row is None or row.result is not None:
                continue
            if row._limit is None or len(row._new_ids) < row._limit:
                row._new_ids.append(token)
                row._first = row._first or now
                row._text.put(torch.tensor([token]))
            if row._limit is not None and len(row._new_ids) >= row._limit:
                self.finish(row)

    def end(self) -> None:
        """Rows still open are finished by the scheduler once generate() has returned."""


@dataclass(frozen=True)
class _Batch:
    size: int
    bucket: int
    rows: int
    started: float
    graphs_before: int
    seed: int | None  # reported to the rows (None when shared or greedy)

    @classmethod
    def unrun(cls, row: BatchRow) -> _Batch:
        """What a row stopped before its turn reports: no batch ran it."""
        return cls(0, row.bucket, 0, time.perf_counter(), CompileCounter.graphs(), None)


class BatchScheduler:
    """Collects chat requests and runs them N at a time through one generate() of exactly N rows."""

    def __init__(self, model: BatchModel, slots: int, context_length: int, jobs: SerialJobs,
                 gather_s: float = GATHER_S):
        self.model, self.slots, self.context_length = model, slots, context_length
        self.jobs, self.gather_s = jobs, gather_s
        self._waiting: list[BatchRow] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        _SCHEDULERS.add(self)

    def close(self, timeout: float = 10.0) -> None:
        """Drop the waiting requests, stop the running batch within one token, wait for the thread to end."""
        with self._cond:
            for row in self._waiting:
                row.cancel.set()
            thread = self._thread
            self._cond.notify_all()
        self.jobs.cancel()
        if thread is not None:
            thread.join(timeout)

    # ----- request threads ------------------------------------------------------------------------
    def submit(self, row: BatchRow) -> None:
        """Put a row in line for a later batch (starts the scheduler thread if none runs)."""
        if row.max_new_tokens > self.context_length - row.bucket:
            raise ValueError(f"max_new_tokens {row.max_new_tokens} does not fit the cache at bucket {row.bucket}")
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="chat-batch", daemon=True)
                self._thread.start()
            self._waiting.append(row)
            self._cond.notify_all()

    def follow(self, row: BatchRow) -> Iterator[str]:
        """The row's text as it is generated; on a normal end ``row.result`` holds its result.

        Re-raises the error of its generate() call. Closing the iterator early sets the row's
        cancel event: its slot stops within one token and the other rows carry on.
        """
        ended = False
        try:
            while True:
                try:
                    kind, value = row._events.get(timeout=POLL_S)
                except queue.Empty:
                    if row.result is not None or self._alive():
                        continue
                    try:  # the thread may have sent its last event and ended just after our timeout
                        kind, value = row._events.get_nowait()
                    except queue.Empty:
                        raise EngineUnavailableError(tr("The chat batch scheduler stopped; restart the app.")) from None
                if kind == _TEXT:
                    yield value
                    continue
                ended = True
                if kind == _ERROR:
                    raise value
                return
        finally:
            if not ended:
                row.cancel.set()

    def _alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    # ----- the scheduler thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while (rows := self._next_batch()) is not None:
            self.run(rows)

    def _next_batch(self) -> list[BatchRow] | None:
        """Wait until a batch may start and return its rows (removed from the line); None: the line is empty."""
        with self._cond:
            while True:
                for row in [r for r in self._waiting if r.cancel.is_set()]:  # stopped before their turn
                    self._waiting.remove(row)
                    row._reason = "stopped"
                    self._finish(row, _Batch.unrun(row))  # its follower gets a result (no tokens)
                if not self._waiting:
                    self._thread = None  # this thread ends; the next submit starts another
                    return None
                rows = self._compatible(self._waiting)
                left = self._waiting[0].submitted + self.gather_s - time.perf_counter()
                if len(rows) == self.slots or rows[0].seed is not None or left <= 0:
                    taken = {id(r) for r in rows}
                    self._waiting = [r for r in self._waiting if id(r) not in taken]
                    return rows
                self._cond.wait(left)

    def _compatible(self, waiting: list[BatchRow]) -> list[BatchRow]:
        """The oldest row and the later ones that can share its generate() call, up to N."""
        first = waiting[0]
        rows = [first]
        if first.seed is not None:  # seeded: alone, so the reply is reproducible
            return rows
        for row in waiting[1:]:
            if len(rows) == self.slots:
                break
            if row.seed is not None or row.sampling != first.sampling:
                continue
            bucket = max(row.bucket, *(r.bucket for r in rows))
            if max(row.max_new_tokens, *(r.max_new_tokens for r in rows)) > self.context_length - bucket:
                continue  # a longer prompt would leave one of them less room than it asked for
            rows.append(row)
        return rows

    # ----- one batch ----------------------------------------------------------------------------------
    def run(self, rows: list[BatchRow], min_new_tokens: int = 0, window_floor: int = 0) -> None:
        """Run one generate() over these rows (1..N) plus padding rows, in the calling thread.

        Never raises: every row ends with its result or with the error (see ``follow``).
        Warm-up calls this directly with ``min_new_tokens=2`` so the decode graph runs, and a
        ``window_floor`` to compile the decode graph of a larger cache window (static_cache.py).
        """
        bucket = max(r.bucket for r in rows)
        slots: list[BatchRow | None] = [*rows, *[None] * (self.slots - len(rows))]
        error: Exception | None = None
        with self.jobs.job() as stop_all:
            try:
                batch = self._start(rows, bucket)
                streamer = _RowStreamer(slots, lambda row: self._finish(row, batch))
                criteria = _RowCriteria(slots, bucket, self.model.eos_ids, stop_all)
                ids, mask = self._inputs(slots, bucket)
                self.model.generate(
                    input_ids=ids, attention_mask=mask, streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([criteria]),
                    max_new_tokens=max(r.max_new_tokens for r in rows), min_new_tokens=min_new_tokens or None,
                    window_floor=window_floor, **rows[0].sampling.generate_kwargs(),
                )
                self.model.synchronize()
                for row in rows:
                    if row.result is None:  # still open when generate() ended (it reached its length)
                        row._reason = row._reason or "length"
                        self._finish(row, batch)
            except Exception as exc:  # noqa: BLE001 - handed to each row's consumer, which re-raises it
                error = exc
        if error is not None:
            for row in rows:
                if row.result is None:
                    row._events.put((_ERROR, error))

    def _start(self, rows: list[BatchRow], bucket: int) -> _Batch:
        seed = None
        if not rows[0].sampling.greedy:
            seed = rows[0].seed if rows[0].seed is not None else secrets.randbits(32)
            torch.manual_seed(seed)  # under the job lock: no other generate() draws from the generator meanwhile
        started = time.perf_counter()
        for row in rows:
            row._text = _RowText(self.model.tokenizer, row._events)
        return _Batch(self.slots, bucket, len(rows), started, CompileCounter.graphs(),
                      seed if len(rows) == 1 else None)

    def _inputs(self, slots: list[BatchRow | None], bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask: [N, bucket], every row left-padded (mask 0 on padding)."""
        pad = self.model.pad_id
        ids, mask = [], []
        for row in slots:
            if row is None:  # a padding row attends to its last token only: finite logits, output discarded
                ids.append([pad] * bucket)
                mask.append([0] * (bucket - 1) + [1])
            else:
                fill = bucket - len(row.ids)
                ids.append([pad] * fill + row.ids)
                mask.append([0] * fill + [1] * len(row.ids))
        device = self.model.input_device
        return torch.tensor(ids, device=device), torch.tensor(mask, device=device)

    def _finish(self, row: BatchRow, batch: _Batch) -> None:
        """Flush the row's held-back text and send its result: it is done even if its batch runs on."""
        if row._text is not None:  # None: stopped before its turn
            row._text.end()
        ended = time.perf_counter()
        row.result = RowResult(
            new_ids=list(row._new_ids), finish_reason=row._reason or "length", bucket=batch.bucket,
            batch_size=batch.size, shared_with=batch.rows, queued_s=batch.started - row.submitted,
            started=batch.started, first_token_at=row._first, ended=ended,
            compiled_graphs=CompileCounter.graphs() - batch.graphs_before, seed=batch.seed,
        )
        row._events.put((_DONE, row.result))


class BatchRunner:
    """A loaded chat engine's replies, N at a time: the engine calls ``warm_up`` and ``stream`` (``Parts.chat_batch``).

    Every ``generate()`` goes through the engine's ``generate_rows`` and holds its job lock, as its single path does.
    """

    def __init__(self, engine):
        model = BatchModel(engine.generate_rows, engine.tokenizer, engine.pad_id, frozenset(engine.eos_ids),
                           engine.placement.input_device, lambda: synchronize(engine.placement))
        self.engine = engine
        self.scheduler = BatchScheduler(model, engine.rows, engine.settings.context_length, engine.jobs)

    def warm_up(self, ids: list[int], bucket: int, window_floor: int = 0) -> None:
        """One row at this bucket plus N-1 padding rows; min 2 tokens so the decode step runs."""
        row = BatchRow(ids, bucket, 2, Sampling(greedy=True))
        self.scheduler.run([row], min_new_tokens=2, window_floor=window_floor)
        for _ in self.scheduler.follow(row):  # raises the error of a failed generate()
            pass

    def stream(self, request: ChatRequest, prompt, stop: threading.Event | None = None) -> Iterator[ChatUpdate]:
        """Stream one reply from a slot of a shared batch; closing this, or setting ``stop``, stops only this reply.
        ``prompt``: the engine's fitted prompt (chat/prompt.py)."""
        splitter = ThinkSplitter(prompt.starts_in_reasoning, tags=prompt.thinking)
        row = BatchRow(prompt.ids, prompt.bucket, prompt.max_new_tokens, Sampling.of(request),
                       None if request.greedy else request.seed)
        row.cancel = stop if stop is not None else row.cancel  # the row's own stop event
        self.scheduler.submit(row)
        texts = self.scheduler.follow(row)
        try:
            for chunk in texts:
                delta = splitter.feed(chunk)
                if delta:
                    yield ChatUpdate(splitter.reasoning, splitter.answer, delta, False, None, prompt.dropped_turns)
        finally:
            texts.close()  # early close: sets the row's own cancel event
        r = row.result
        stats = self.engine._stats(replace(prompt, bucket=r.bucket), r.new_ids, r.finish_reason == "stopped",
                                   r.started, r.first_token_at, r.ended, r.compiled_graphs, r.seed)
        stats = replace(stats, batch_size=r.batch_size, queued_s=r.queued_s)
        yield ChatUpdate(splitter.reasoning, splitter.answer, splitter.finish(), True, stats, prompt.dropped_turns)


_SCHEDULERS: weakref.WeakSet[BatchScheduler] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At interpreter exit, end every scheduler thread: one that ran torch and is still alive when
    the process ends aborts it ("terminate called without an active exception"). A reply's final
    update can reach its caller just before its generate() returns, so a script may end right then."""
    for scheduler in list(_SCHEDULERS):
        scheduler.close()
