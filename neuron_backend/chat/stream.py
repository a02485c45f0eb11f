"""How one chat reply runs: generate() on a long-lived thread, feeding a streamer the consumer reads.

The pieces ``ChatEngine`` uses on its single (batch 1) path: the cancel check generate() reads
after every token, the streamer that notes the first token's time, the engine's one generate
thread, the worker that keeps a call's output or exception, and the loop that reads text until
the call ends.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import torch
from transformers import StoppingCriteria, TextIteratorStreamer

from .. import devices, parallel

STREAM_POLL_S = 0.5  # streamer queue timeout: how often a waiting consumer checks the worker is alive


class CancelCriteria(StoppingCriteria):
    """Reads a threading.Event after every token: generate() stops within one token once it is set."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        stop = self.event.is_set()
        if parallel.active("chat"):  # tensor parallel: every rank stops at rank 0's token
            stop = parallel.stop_flag(stop)
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
    """One long-lived daemon thread that runs an engine's generate() calls, one after another.

    Not a new thread per reply: glibc gives each new thread a fresh malloc arena, so every reply's
    prefill page-faulted its large temporaries in again (+0.3 s, 18%, to the first token of the
    Qwen3-0.6B architecture on CPU; bench/chat_overhead.py). The thread ends with its engine. It is
    named "chat-generate" only while a generate() runs (``IDLE_NAME`` otherwise), so a look at the
    thread names still tells whether a generation is running.
    """

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


