"""Chat feedback: 👍/👎 marks on replies, kept in a bounded JSONL under the cache root (the QA bench reads it).

Files in ``<cache-dir>/feedback/``:

- ``marks.jsonl``: one row per mark: id, time, rating (``up``/``down``), comment, the prompt (the
  user message the reply answered), the reply, the turn number, the reply's settings and stats.
  Past ``max_bytes`` it is rotated: ``marks.jsonl`` becomes ``marks.1.jsonl``, ``marks.1`` becomes
  ``marks.2`` and so on up to ``marks.<ROTATIONS>.jsonl``. No rotation ever drops a file: when the
  last rotation exists and the current file is full, a new mark is refused (``chat_err_feedback_full``)
  until an operator moves the files away. So no client can push stored marks out by marking a lot;
  at worst it fills the storage (at most ``(ROTATIONS + 1) * max_bytes``) and further marks wait.
- ``qa-prompts.jsonl``: a QA bench prompt set rebuilt after every change: first every row of
  ``reviewed.jsonl`` (the operator's reviewed prompts, written by hand; anonymous marks never push
  them out), then the newest distinct marked prompts, disliked first, up to ``MAX_QA_PROMPTS``; each
  row a ``prompt`` plus the chat settings columns ``qa/inputs.py`` reads (seed, system_prompt,
  thinking, greedy, temperature, top_p, top_k, max_new_tokens). The QA bench re-runs each prompt
  alone, without earlier turns.

A mark is bounded by what the app itself accepts and produces: its prompt by ``--max-prompt-chars``,
its reply by ``--max-new-tokens`` times ``MAX_CHARS_PER_TOKEN``; bigger marks are refused with the
limit named. The page also caps marks per Gradio session (``MAX_MARKS_PER_SESSION``, tools/qa/feedback_row.py);
here, marks per client address (``MAX_MARKS_PER_CLIENT`` an hour: fresh sessions do not reset it) and from all
clients together (``MAX_MARKS_PER_MINUTE``), each refusal naming its limit.

Rows are read by ``\\n`` only (``str.splitlines`` would also split on U+2028, U+2029 and NEL inside a
text), and written with those three characters escaped, so any line reader sees one row per line.

A crash or a full disk mid-write leaves a torn last line: the next mark first ends that fragment with a
newline (the fragment is then one damaged line, skipped by every reader), so the new mark is a row of its own.
Each mark is flushed and fsynced before the visitor is thanked.

Thread-safe: one lock around every read-modify-write (many visitors may mark replies at once).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path

from neuron_backend.errors import ConfigError, InvalidRequestError
from neuron_backend.messages import tr
from neuron_backend.settings import as_int

log = logging.getLogger("showcase.feedback")

RATINGS = ("up", "down")
MAX_COMMENT_CHARS = 2000
MAX_REPLY_CHARS = 8000  # the stored reply is for reading; the QA bench regenerates it
MAX_QA_PROMPTS = 100  # qa/inputs.py: at most 100 prompts in one set
# A generated token decodes to a few characters on average; 32 per token is a generous upper
# bound on a whole reply, so a reply longer than max_new_tokens * 32 characters was not generated here.
MAX_CHARS_PER_TOKEN = 32
MAX_MARKS_PER_SESSION = 20  # marks one Gradio session may store (tools/qa/feedback_row.py counts them)
MAX_MARKS_PER_CLIENT = 40  # marks one client address may store in CLIENT_WINDOW_S (two sessions' worth)
CLIENT_WINDOW_S = 3600.0
MAX_MARKS_PER_MINUTE = 60  # marks all clients together may store in a minute
MAX_CLIENTS_TRACKED = 10_000  # addresses whose recent marks are remembered (the oldest forgotten first)
ROTATIONS = 4  # marks.1.jsonl .. marks.4.jsonl; none is ever dropped by a new mark
# The chat settings a QA prompt-set row may carry (qa/inputs.py SETTINGS, chat kind).
QA_SETTINGS = ("seed", "system_prompt", "thinking", "greedy", "temperature", "top_p", "top_k", "max_new_tokens")
# Line separators for str.splitlines() that json.dumps(ensure_ascii=False) leaves raw.
_RAW_SEPARATORS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class FeedbackLog:
    """Appends marks to ``folder/marks.jsonl`` and keeps ``folder/qa-prompts.jsonl`` in step."""

    def __init__(self, folder: Path, max_bytes: int = 2_000_000, max_prompt_chars: int = 20_000,
                 max_reply_chars: int = 1024 * MAX_CHARS_PER_TOKEN, rotations: int = ROTATIONS,
                 per_client: int = MAX_MARKS_PER_CLIENT, per_minute: int = MAX_MARKS_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic):
        self.folder, self.max_bytes, self.rotations = Path(folder), max_bytes, max(1, rotations)
        self.max_prompt_chars, self.max_reply_chars = max_prompt_chars, max_reply_chars
        self.per_client, self.per_minute, self.clock = per_client, per_minute, clock
        self.path = self.folder / "marks.jsonl"
        self.rotated = self.folder / "marks.1.jsonl"
        self.prompt_set = self.folder / "qa-prompts.jsonl"
        self.reviewed = self.folder / "reviewed.jsonl"  # the operator's; read, never written here
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, deque] = OrderedDict()  # address -> times of its recent marks
        self._everyone: deque = deque()  # times of the marks of the last minute

    @classmethod
    def for_settings(cls, settings) -> FeedbackLog:
        """The log under ``<cache-dir>/feedback`` with the bounds of ``settings``."""
        return cls(Path(settings.cache_dir) / "feedback", feedback_max_bytes(settings), settings.max_prompt_chars,
                   settings.max_new_tokens * MAX_CHARS_PER_TOKEN)

    def rotation(self, n: int) -> Path:
        """``marks.<n>.jsonl`` (1 is the newest rotation)."""
        return self.folder / f"marks.{n}.jsonl"

    def files(self) -> list[Path]:
        """Every marks file, oldest first (the last rotation first, the current file last)."""
        return [self.rotation(n) for n in range(self.rotations, 0, -1)] + [self.path]

    def record(self, rating: str, prompt: str, reply: str, settings: dict | None = None,
               stats: dict | None = None, comment: str = "", turn: int | None = None,
               client: str | None = None) -> str:
        """Store one mark of ``client`` (its address; None: not counted per client); return its id."""
        if rating not in RATINGS:
            raise InvalidRequestError(tr("Feedback rating {rating} is not one of {allowed}.",
                                         rating=repr(rating), allowed=", ".join(RATINGS)))
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidRequestError(tr("Only a reply to a user message can be marked."))
        reply = reply if isinstance(reply, str) else str(reply)
        if len(prompt) > self.max_prompt_chars:
            raise InvalidRequestError(tr("The marked prompt is {length} characters; a mark may hold at most {limit} "
                                         "(--max-prompt-chars); it was not stored.", length=len(prompt),
                                          limit=self.max_prompt_chars))
        if len(reply) > self.max_reply_chars:
            raise InvalidRequestError(tr("The marked reply is {length} characters; a reply of this server is at most "
                                         "{limit} ({per_token} per token of --max-new-tokens); it "
                                         "was not stored.", length=len(reply),
                                          limit=self.max_reply_chars, per_token=MAX_CHARS_PER_TOKEN))
        row = {"id": uuid.uuid4().hex[:12], "time": round(time.time(), 3), "rating": rating,
               "comment": _comment(comment), "prompt": prompt, "reply": reply[:MAX_REPLY_CHARS], "turn": turn,
               "settings": {k: v for k, v in (settings or {}).items() if k in QA_SETTINGS and v is not None},
               "stats": stats or {}}
        line = _dumps(row)
        size = len(line.encode())
        if size > self.max_bytes:
            raise InvalidRequestError(tr("This mark is larger than the feedback file may grow ({limit} bytes, "
                                         "--feedback-max-bytes); it was not stored.", limit=self.max_bytes))
        with self._lock:
            now = self._within_budget(client)
            self.folder.mkdir(parents=True, exist_ok=True)
            current = self.path.stat().st_size if self.path.exists() else 0
            if current and current + size > self.max_bytes:
                self._rotate()
            self._append(line.encode())
            self._count(client, now)
            self._write_prompt_set()
        return row["id"]

    def _within_budget(self, client: str | None) -> float:
        """Refuse a mark past the client's budget or the global rate; the caller holds the lock. Returns now."""
        now = self.clock()
        while self._everyone and now - self._everyone[0] > 60.0:
            self._everyone.popleft()
        if len(self._everyone) >= self.per_minute:
            raise InvalidRequestError(tr("The server stores at most {limit} marks a minute from all visitors together; "
                                         "this one was not stored. Try again in a minute.", limit=self.per_minute))
        times = self._clients.get(client) if client is not None else None
        while times and now - times[0] > CLIENT_WINDOW_S:
            times.popleft()
        if times is not None and len(times) >= self.per_client:
            raise InvalidRequestError(tr("Your address has stored {limit} marks in the last hour, the most one "
                                         "visitor may store; this one was not stored.", limit=self.per_client))
        return now

    def _count(self, client: str | None, now: float) -> None:
        self._everyone.append(now)
        if client is not None:
            self._clients.setdefault(client, deque()).append(now)
            self._clients.move_to_end(client)
            while len(self._clients) > MAX_CLIENTS_TRACKED:
                self._clients.popitem(last=False)

    def _append(self, data: bytes) -> None:
        """``data`` (one row) at the end of marks.jsonl, on a line of its own even after a torn last line."""
        with self.path.open("ab") as f:
            if f.tell() and not _ends_a_line(self.path):
                data = b"\n" + data  # the fragment a crash left becomes one damaged line
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _rotate(self) -> None:
        """Shift marks.jsonl -> marks.1 -> ... -> marks.N; refuse when marks.N exists (nothing is dropped)."""
        if self.rotation(self.rotations).exists():
            log.warning("feedback storage full (%d files of %d bytes under %s): marks refused until moved away",
                        self.rotations + 1, self.max_bytes, self.folder)
            raise InvalidRequestError(tr("The feedback storage is full; marks are not stored until the operator "
                                         "archives the files under <cache-dir>/feedback."))
        for n in range(self.rotations - 1, 0, -1):
            if self.rotation(n).exists():
                self.rotation(n).replace(self.rotation(n + 1))
        self.path.replace(self.rotated)

    def comment(self, mark_id: str, text: str) -> bool:
        """Set the comment of mark ``mark_id`` (in the current file); return whether it was found."""
        text = _comment(text)
        with self._lock:
            rows = _read(self.path)
            found = False
            for row in rows:
                if row.get("id") == mark_id:
                    row["comment"], found = text, True
            if found:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text("".join(_dumps(r) for r in rows), encoding="utf-8")
                tmp.replace(self.path)
        return found

    def marks(self) -> list[dict]:
        """Every stored mark, oldest first (the oldest rotation first)."""
        with self._lock:
            return self._all()

    def _all(self) -> list[dict]:
        return [row for path in self.files() for row in _read(path)]

    def _write_prompt_set(self) -> None:
        """Rebuild qa-prompts.jsonl: the reviewed rows, then the newest distinct marked prompts (with their
        settings), disliked first."""
        rows, seen = [], set()
        for qa in _read(self.reviewed)[:MAX_QA_PROMPTS]:  # never pushed out by marks
            seen.add(json.dumps(qa, sort_keys=True))
            rows.append(qa)
        marks = self._all() if len(rows) < MAX_QA_PROMPTS else []
        for mark in sorted(reversed(marks), key=lambda m: m.get("rating") != "down"):  # stable: newest first
            qa = {"prompt": mark["prompt"], **mark.get("settings", {})}
            key = json.dumps(qa, sort_keys=True)
            if key not in seen:
                seen.add(key)
                rows.append(qa)
            if len(rows) == MAX_QA_PROMPTS:
                break
        tmp = self.prompt_set.with_suffix(".tmp")
        tmp.write_text("".join(_dumps(r) for r in rows), encoding="utf-8")
        tmp.replace(self.prompt_set)


def feedback_max_bytes(settings) -> int:
    """--feedback-max-bytes (the plug-in's flag), checked; default 2,000,000."""
    size = as_int("feedback-max-bytes", settings.options.get("feedback_max_bytes", 2_000_000))
    if size < 10_000:
        raise ConfigError("--feedback-max-bytes", f"{size} is too small", "10000 or more")
    return size


def session_budget_left(count: int) -> None:
    """Refuse a mark when a session has already stored ``MAX_MARKS_PER_SESSION`` of them."""
    if count >= MAX_MARKS_PER_SESSION:
        raise InvalidRequestError(tr("This session has stored {limit} marks, the most one session may store; this one "
                                     "was not stored.", limit=MAX_MARKS_PER_SESSION))


def _dumps(row: dict) -> str:
    """One JSON line; U+0085, U+2028 and U+2029 escaped so that no line reader splits the row."""
    text = json.dumps(row, ensure_ascii=False)
    for raw, escaped in _RAW_SEPARATORS.items():
        text = text.replace(raw, escaped)
    return text + "\n"


def _comment(text: str | None) -> str:
    text = (text or "").strip()
    if len(text) > MAX_COMMENT_CHARS:
        raise InvalidRequestError(tr("The comment is {length} characters; at most {limit} are allowed.",
                                     length=len(text), limit=MAX_COMMENT_CHARS))
    return text


def _ends_a_line(path: Path) -> bool:
    """Whether the file's last byte is a newline (an empty file ends none)."""
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _read(path: Path) -> list[dict]:
    """The rows of a marks file, split on ``\\n`` only; a damaged line (e.g. a crash mid-write) is skipped."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            rows.append(row)
    return rows
