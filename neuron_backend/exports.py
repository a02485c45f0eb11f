"""One bounded, cleaned folder for the files the page hands out: exports and images that were not saved.

Gradio copies a returned file into its own cache, so a file here is needed only until then. The bounds:
docs/security.md, "What is served from where".
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from .errors import ShowcaseError, StorageError, storage_reason
from .messages import tr

log = logging.getLogger("showcase.exports")

EXPORTS_DIR_NAME = "exports"
DEFAULT_LIMIT = 64
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_AGE_S = 24 * 3600.0
TMP_PREFIX = ".tmp-"
STALE_TMP_S = 600.0  # a temporary file not written to for this long belongs to no write in progress


class ExportFolder:
    """Exports under one folder of at most ``limit`` files and ``max_bytes`` (oldest out first; files older than
    ``max_age_s`` and ``.tmp-*`` leftovers removed at start and on every write). ``write`` is safe from many
    threads (one lock), never prunes the file just written, and renames a finished file into place."""

    def __init__(self, folder: Path, limit: int = DEFAULT_LIMIT, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age_s: float = DEFAULT_MAX_AGE_S):
        self.folder = Path(folder)
        self.limit, self.max_bytes, self.max_age_s = max(1, limit), max_bytes, max_age_s
        self._lock = threading.Lock()
        self._produce_lock = threading.Lock()  # write_keyed: one production at a time
        self._writing: set[str] = set()  # names of this process's temporary files in progress
        with self._lock:
            self._prune(keep=None)  # leftovers of earlier runs

    def write(self, data: str | bytes, suffix: str, prefix: str = "export") -> Path:
        """Write ``data`` (text as UTF-8) to a new file ``<prefix>-<time>-<id><suffix>``; return its path.

        Raises StorageError (an OSError) when the folder cannot be written (full or read-only disk): its
        message says what to do, without Python's text or the server's path; the log has both.
        """
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe_prefix = "".join(c if c.isalnum() or c in "-_" else "-" for c in prefix)[:40] or "export"
        with self._lock:
            path = self.folder / f"{safe_prefix}-{stamp}-{uuid.uuid4().hex[:8]}{suffix}"
            tmp = self.folder / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(payload)
                os.replace(tmp, path)
            except OSError as exc:
                raise self._unwritable(exc) from None
            finally:
                _remove_quietly(tmp)
            self._prune(keep=path)
        return path

    def write_keyed(self, key: str, suffix: str, prefix: str, produce: Callable[[Path, int], None]) -> Path:
        """The export of ``key`` (a fingerprint of its content): the file already written for it while it is still
        here, else a new one that ``produce(tmp_path, max_bytes)`` writes (it must stop past ``max_bytes``), renamed
        into place and pruned like ``write``. Productions are serialized (the same key then finds the first one's
        file); ``produce`` runs outside the folder's lock, its temporary file on top of the folder's bound.
        """
        safe_key = "".join(c for c in key if c.isalnum())[:32] or "export"
        safe_prefix = "".join(c if c.isalnum() or c in "-_" else "-" for c in prefix)[:40] or "export"
        path = self.folder / f"{safe_prefix}-{safe_key}{suffix}"
        with self._produce_lock:
            if path.is_file():
                return path
            tmp = self.folder / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            self._writing.add(tmp.name)
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                produce(tmp, self.max_bytes)
                with self._lock:
                    os.replace(tmp, path)
                    self._prune(keep=path)
            except OSError as exc:
                if isinstance(exc, ShowcaseError):  # ``produce``'s own refusal says what it means
                    raise
                raise self._unwritable(exc) from None
            finally:
                self._writing.discard(tmp.name)
                _remove_quietly(tmp)
        return path

    def write_png(self, image, prefix: str = "image") -> Path:
        """Write a PIL image as PNG (for images the outputs folder did not keep)."""
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return self.write(buffer.getvalue(), ".png", prefix)

    def _unwritable(self, exc: OSError) -> StorageError:
        log.warning("could not write an export under %s: %s", self.folder, exc)  # the operator's details
        return StorageError(tr("Could not write the file: the exports folder of the cache root could not be "
                               "written ({reason}).", reason=storage_reason(exc)))

    def files(self) -> list[Path]:
        """The exported files, oldest first."""
        try:
            entries = [p for p in self.folder.iterdir() if p.is_file() and not p.name.startswith(TMP_PREFIX)]
        except OSError:
            return []
        return sorted(entries, key=lambda p: (_mtime(p), p.name))

    def _prune(self, keep: Path | None) -> None:
        """Drop files past the age, count and byte bounds, oldest first (never ``keep``), and stale temporary
        files (``_drop_stale_temporaries``)."""
        self._drop_stale_temporaries()
        files = self.files()
        now = time.time()
        sizes = {p: _size(p) for p in files}
        total, count = sum(sizes.values()), len(files)
        for path in files:
            if path == keep:
                continue
            too_old = now - _mtime(path) > self.max_age_s
            if not (too_old or count > self.limit or total > self.max_bytes):
                continue
            try:
                path.unlink()
            except OSError as exc:
                log.warning("could not remove old export %s: %s", path, exc)
                continue
            total, count = total - sizes[path], count - 1


    def _drop_stale_temporaries(self) -> None:
        """Remove ``.tmp-*`` files of writes that died (a killed export), never one this process is writing
        (``produce`` may write its own ``<tmp>.tmp`` beside it, so the prefix is what counts)."""
        try:
            leftovers = [p for p in self.folder.iterdir() if p.name.startswith(TMP_PREFIX) and p.is_file()]
        except OSError:
            return
        now = time.time()
        for path in leftovers:
            if any(path.name.startswith(live) for live in self._writing) or now - _mtime(path) <= STALE_TMP_S:
                continue
            try:
                path.unlink()
            except OSError as exc:
                log.warning("could not remove an unfinished export %s: %s", path, exc)


def _remove_quietly(path: Path) -> None:
    """Remove a temporary file; a failure to (the disk that refused the write) is not what gets reported."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
