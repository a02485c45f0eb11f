"""Chat feedback: 👍/👎 marks on replies, kept in a bounded JSONL under the cache root.

Two files in ``<cache-dir>/feedback/``:

- ``marks.jsonl``: one row per mark: id, time, rating (``up``/``down``), comment, the prompt (the
  user message the reply answered), the reply, the turn number, the reply's settings and stats.
  Past ``max_bytes`` it is rotated to ``marks.1.jsonl`` (the older rotation is dropped), so the two
  files together hold at most about twice ``max_bytes``.
- ``qa-prompts.jsonl``: a QA bench prompt set rebuilt after every change: the newest
  ``MAX_QA_PROMPTS`` distinct marked prompts, disliked first, each row a ``prompt`` plus the chat
  settings columns ``qa/inputs.py`` reads (seed, system_prompt, thinking, greedy, temperature,
  top_p, top_k, max_new_tokens). The QA bench re-runs each prompt alone, without earlier turns.

Thread-safe: one lock around every read-modify-write (many visitors may mark replies at once).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

from .errors import InvalidRequestError
from .messages import msg

RATINGS = ("up", "down")
MAX_COMMENT_CHARS = 2000
MAX_REPLY_CHARS = 8000  # the stored reply is for reading; the QA bench regenerates it
MAX_QA_PROMPTS = 100  # qa/inputs.py: at most 100 prompts in one set
# The chat settings a QA prompt-set row may carry (qa/inputs.py SETTINGS, chat kind).
QA_SETTINGS = ("seed", "system_prompt", "thinking", "greedy", "temperature", "top_p", "top_k", "max_new_tokens")


class FeedbackLog:
    """Appends marks to ``folder/marks.jsonl`` and keeps ``folder/qa-prompts.jsonl`` in step."""

    def __init__(self, folder: Path, max_bytes: int = 2_000_000):
        self.folder, self.max_bytes = Path(folder), max_bytes
        self.path = self.folder / "marks.jsonl"
        self.rotated = self.folder / "marks.1.jsonl"
        self.prompt_set = self.folder / "qa-prompts.jsonl"
        self._lock = threading.Lock()

    def record(self, rating: str, prompt: str, reply: str, settings: dict | None = None,
               stats: dict | None = None, comment: str = "", turn: int | None = None) -> str:
        """Store one mark; return its id (to add a comment later)."""
        if rating not in RATINGS:
            raise InvalidRequestError(msg("chat_err_feedback_rating", rating=repr(rating), allowed=", ".join(RATINGS)))
        if not prompt or not prompt.strip():
            raise InvalidRequestError(msg("chat_err_feedback_no_prompt"))
        row = {"id": uuid.uuid4().hex[:12], "time": round(time.time(), 3), "rating": rating,
               "comment": _comment(comment), "prompt": prompt, "reply": reply[:MAX_REPLY_CHARS], "turn": turn,
               "settings": {k: v for k, v in (settings or {}).items() if k in QA_SETTINGS and v is not None},
               "stats": stats or {}}
        line = json.dumps(row, ensure_ascii=False) + "\n"
        if len(line.encode()) > self.max_bytes:
            raise InvalidRequestError(msg("chat_err_feedback_too_large", limit=self.max_bytes))
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            size = self.path.stat().st_size if self.path.exists() else 0
            if size + len(line.encode()) > self.max_bytes:
                self.path.replace(self.rotated)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
            self._write_prompt_set()
        return row["id"]

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
                tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
                tmp.replace(self.path)
        return found

    def marks(self) -> list[dict]:
        """Every stored mark, oldest first (the rotated file first)."""
        with self._lock:
            return _read(self.rotated) + _read(self.path)

    def _write_prompt_set(self) -> None:
        """Rebuild qa-prompts.jsonl: newest distinct prompts (with their settings), disliked first."""
        rows, seen = [], set()
        marks = _read(self.rotated) + _read(self.path)
        for mark in sorted(reversed(marks), key=lambda m: m.get("rating") != "down"):  # stable: newest first
            qa = {"prompt": mark["prompt"], **mark.get("settings", {})}
            key = json.dumps(qa, sort_keys=True)
            if key not in seen:
                seen.add(key)
                rows.append(qa)
            if len(rows) == MAX_QA_PROMPTS:
                break
        tmp = self.prompt_set.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(self.prompt_set)


def _comment(text: str | None) -> str:
    text = (text or "").strip()
    if len(text) > MAX_COMMENT_CHARS:
        raise InvalidRequestError(msg("chat_err_comment_too_long", length=len(text), limit=MAX_COMMENT_CHARS))
    return text


def _read(path: Path) -> list[dict]:
    """The rows of a marks file; a damaged line (e.g. a crash mid-write) is skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            rows.append(row)
    return rows
