"""Where model weights come from: a local folder, the local Hugging Face cache, or the Hub.

A model counts as present only when every file it needs is there (model_files.py: config,
tokenizer, every weight shard; for a pipeline every component). Missing files are fetched from
the Hub, only those, one at a time through ``huggingface_hub.hf_hub_download`` (which resumes a
partial ``.incomplete`` blob). Every network call is bounded: the Hub probe by ``--hub-timeout``,
each metadata request by the same ``etag_timeout``, and a download that receives no byte for
``--download-stall-timeout`` seconds is abandoned with an error that says how to fetch the files
by hand. (huggingface_hub retries a silent server itself, up to 60 s per request and 5 times per
file; the watchdog here does not wait for that.) Offline use never touches the network.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .errors import EngineUnavailableError
from .messages import tr
from .model_files import (
    CHAT_EXTRAS,
    BrokenModelFile,
    component_kind,
    joined,
    missing_in_folder,
    needs_for,
    pipeline_components,
    said,
    verify_folder,
)

_MARKERS = ("config.json", "model_index.json")
ProgressFn = Callable[[float, str], None]


def local_folder(model: str) -> Path | None:
    """The folder ``model`` names, or None when it is a hub id."""
    path = Path(model).expanduser()
    return path if path.is_dir() else None


def check_folder(path: Path) -> None:
    """Raise EngineUnavailableError when a model folder lacks its config."""
    if not any((path / marker).is_file() for marker in _MARKERS):
        raise EngineUnavailableError(tr("Model folder {path} has no config.json or model_index.json: point "
                                        "--chat-model/--image-model at a folder saved with "
                                        "save_pretrained().", path=path))


def kind_of_folder(path: Path) -> str:
    """'image' for a diffusers pipeline folder (model_index.json), else 'chat'."""
    return "image" if (Path(path) / "model_index.json").is_file() else "chat"


def cached_snapshot(model: str, revision: str = "main") -> Path | None:
    """The snapshot folder ``refs/<revision>`` points at in the local Hugging Face cache, or None.

    Reads the cache layout directly (``models--org--name/refs/main`` -> ``snapshots/<commit>``),
    so a partial snapshot is found too; what it lacks is for ``missing_files`` to say.
    """
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=model, repo_type="model")
    try:
        commit = (storage / "refs" / revision).read_text().strip()
    except OSError:
        return None
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def in_local_cache(model: str) -> Path | None:
    """The cached snapshot of a hub id when it holds every needed file, else None."""
    snapshot = cached_snapshot(model)
    if snapshot is None:
        return None
    return snapshot if not _missing(snapshot, kind_of_folder(snapshot)) else None


def missing_files(model: str, kind: str) -> list[str]:
    """Which needed files of ``model`` ("chat" or "image") are missing locally; [] when all are there.

    ``model`` is a hub id (looked up in the local Hugging Face cache, HF_HUB_CACHE) or a local
    folder. Nothing is downloaded and the network is never used. A model that is not cached at
    all lists its top-level needs (e.g. ``config.json`` ... or ``model_index.json``).
    For the doctor (tools/doctor.py) and ``--models auto``.
    """
    folder = local_folder(model)
    if folder is None:
        folder = cached_snapshot(model)
    if folder is None:
        return missing_in_folder(Path("/nonexistent-model-folder"), kind)
    return _missing(folder, kind)


def _missing(folder: Path, kind: str) -> list[str]:
    try:
        return missing_in_folder(folder, kind)
    except BrokenModelFile as exc:
        return [said(exc)]


def _listed(names: list[str], limit: int = 6) -> str:
    shown = joined(names[:limit])
    return tr("{shown} and {n} more", shown=shown, n=len(names) - limit) if len(names) > limit else shown


def _hub_reachable(model: str, timeout: float) -> tuple[bool, str]:
    """Ask the Hub about ``model``, giving up after ``timeout`` seconds whatever happens."""
    import huggingface_hub

    if huggingface_hub.constants.is_offline_mode():
        return False, tr("HF_HUB_OFFLINE is set")
    result: list[tuple[bool, str]] = []

    def ask() -> None:
        try:
            huggingface_hub.HfApi(endpoint=huggingface_hub.constants.ENDPOINT).model_info(model, timeout=timeout)
            result.append((True, tr("the Hub is reachable")))
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            result.append((False, tr("the Hub is unreachable ({kind})", kind=type(exc).__name__)))

    thread = threading.Thread(target=ask, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    if not result:
        return False, tr("the Hub did not answer within {timeout}s", timeout=f"{timeout:g}")
    return result[0]


def weights_available(model: str, timeout: float, kind: str | None = None) -> tuple[bool, str]:
    """Whether ``model`` can be loaded now (every needed file local) or fetched (Hub reachable), and why."""
    folder = local_folder(model)
    if folder is not None:
        try:
            check_folder(folder)
        except EngineUnavailableError as exc:
            return False, said(exc)
        missing = _missing(folder, kind or kind_of_folder(folder))
        if missing:
            return False, tr("local folder {folder} lacks {n} needed file(s): {files}",
                             folder=folder, n=len(missing), files=_listed(missing))
        return True, tr("local folder {folder}", folder=folder)
    kind = kind or "chat"
    missing = missing_files(model, kind)
    if not missing:
        return True, tr("{model} is in the local Hugging Face cache", model=model)
    where = tr("is not in the local Hugging Face cache") if cached_snapshot(model) is None else tr(
        "lacks {n} needed file(s) in the local Hugging Face cache ({files})", n=len(missing), files=_listed(missing))
    ok, hub = _hub_reachable(model, timeout)
    if ok:
        return True, tr("{model} {where}; they will be downloaded ({hub})", model=model, where=where, hub=hub)
    return False, tr("{model} {where} and {hub}", model=model, where=where, hub=hub)


def obtain(model: str, progress: ProgressFn | None = None, kind: str | None = None, *,
           hub_timeout: float = 10.0, stall_timeout: float = 60.0, flag: str = "--chat-model") -> Path:
    """Return a local folder holding every file ``model`` needs, each one whole (see ``find_or_fetch``).

    Raises EngineUnavailableError naming every missing or damaged file (a truncated shard, an
    unreadable config) and what to do.
    """
    folder = find_or_fetch(model, progress, kind, hub_timeout=hub_timeout, stall_timeout=stall_timeout, flag=flag)
    problems = verify_folder(folder, kind or kind_of_folder(folder))
    if problems:
        raise EngineUnavailableError(tr(
            "{model} in {folder} has damaged or missing files: {problems}. Fetch them again (`{command}`) or pass a "
            "complete folder with {flag}.", model=model, folder=folder, problems=joined(problems[:12], "{a}; {b}"),
            command=_hf_download_command("<repo>" if local_folder(model) else model, []), flag=flag))
    return folder


def find_or_fetch(model: str, progress: ProgressFn | None = None, kind: str | None = None, *,
           hub_timeout: float = 10.0, stall_timeout: float = 60.0, flag: str = "--chat-model") -> Path:
    """Return a local folder holding every file ``model`` needs, downloading only the missing ones.

    ``progress(fraction, text)`` is called as bytes arrive (only when downloading). Raises
    EngineUnavailableError listing the missing files when they cannot be fetched (offline, the
    Hub unreachable, a stalled download).
    """
    folder = local_folder(model)
    if folder is not None:
        check_folder(folder)
        kind = kind or kind_of_folder(folder)
        missing = _missing(folder, kind)
        if missing:
            raise EngineUnavailableError(tr("Model folder {folder} lacks {n} needed file(s): {files}. Copy them in "
                                            "(e.g. hf download <repo> --local-dir <folder>) or point the flag at a "
                                            "complete folder.", folder=folder, n=len(missing),
                                             files=_listed(missing, 12)))
        return folder
    kind = kind or "chat"
    snapshot = cached_snapshot(model)
    missing = missing_files(model, kind)
    if snapshot is not None and not missing:
        return snapshot
    import huggingface_hub

    if huggingface_hub.constants.is_offline_mode():
        raise EngineUnavailableError(tr("{model}: {n} needed file(s) are not in the local Hugging Face cache "
                                        "({files}) and HF_HUB_OFFLINE is set. Go online, or fetch them elsewhere with "
                                        "`{command}` and "
                                        "pass the folder "
                                        "with {flag}.", model=model, n=len(missing), files=_listed(missing, 12),
                                         command=_hf_download_command(model, missing), flag=flag))
    return _Download(model, kind, progress, hub_timeout, stall_timeout, flag).run()


def _hf_download_command(model: str, files: list[str]) -> str:
    if not files or len(files) > 8 or any(":" in f for f in files):
        return f"hf download {model} --local-dir <folder>"
    return f"hf download {model} {' '.join(files)} --local-dir <folder>"


class _Download:
    """Fetch the files ``model`` needs on a worker thread, watched for stalls by the caller's thread.

    The worker only touches this object's counters (under ``_lock``); the caller polls them and
    gives up when nothing moved for ``stall_timeout`` seconds. An abandoned worker is a daemon
    thread that ends when huggingface_hub's own timeouts fire.
    """

    def __init__(self, model, kind, progress, hub_timeout, stall_timeout, flag):
        self.model, self.kind, self.progress = model, kind, progress
        self.hub_timeout, self.stall_timeout, self.flag = hub_timeout, stall_timeout, flag
        self._lock = threading.Lock()
        self.done_bytes = 0
        self.total_bytes: int | None = None
        self.files: list[str] = []
        self.last_activity = time.monotonic()
        self.started = time.monotonic()
        self.result: Path | None = None
        self.error: BaseException | None = None

    # ----- the caller's side -----------------------------------------------------------------
    def run(self) -> Path:
        worker = threading.Thread(target=self._work, name=f"download-{self.model}", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.25)
            with self._lock:
                idle = time.monotonic() - self.last_activity
            self._report()
            if worker.is_alive() and idle > self.stall_timeout:
                raise EngineUnavailableError(tr(
                    "Downloading {model} stalled: nothing arrived for {timeout} s ({amount}). Fetch it by hand with "
                    "`{command}` and "
                    "pass the folder "
                    "with {flag}, or "
                    "raise "
                    "--download-stall-timeout.",
                                                model=self.model, timeout=f"{self.stall_timeout:g}",
                                                amount=self._amount(),
                    command=_hf_download_command(self.model, self.files), flag=self.flag))
        if self.error is not None:
            raise EngineUnavailableError(tr(
                "Could not download {model} ({kind}: {error}). Check the network or HF_TOKEN, or fetch it with "
                "`{command}` and pass the folder with {flag}; "
                "--models tiny runs the demo models.", model=self.model, kind=type(self.error).__name__,
                error=said(self.error), command=_hf_download_command(self.model, self.files),
                flag=self.flag)) from self.error
        assert self.result is not None
        return self.result

    def _amount(self) -> str:
        done = f"{self.done_bytes / 1e9:.2f}"
        if self.total_bytes:
            return tr("{done} GB of {total} GB received", done=done, total=f"{self.total_bytes / 1e9:.2f}")
        return tr("{done} GB received", done=done)

    def _report(self) -> None:
        if self.progress is None or not self.total_bytes:
            return
        with self._lock:
            done, total = self.done_bytes, self.total_bytes
        rate = done / max(1e-6, time.monotonic() - self.started)
        self.progress(min(1.0, done / total), tr("{done} / {total} GB · {rate} MB/s · {files} file(s)",
                                                 done=f"{done / 1e9:.2f}",
                                                  total=f"{total / 1e9:.2f}", rate=f"{rate / 1e6:.1f}",
                                                  files=len(self.files)))

    # ----- the worker's side -----------------------------------------------------------------
    def _touch(self, nbytes: int = 0) -> None:
        with self._lock:
            self.done_bytes += nbytes
            self.last_activity = time.monotonic()

    def _work(self) -> None:
        try:
            self.result = self._fetch()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by run()
            self.error = exc

    def _fetch(self) -> Path:
        import huggingface_hub

        endpoint = huggingface_hub.constants.ENDPOINT  # explicit: some URL templates are fixed at import
        info = huggingface_hub.HfApi(endpoint=endpoint).model_info(self.model, files_metadata=True,
                                                                   timeout=self.hub_timeout)
        self._touch()
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
        fetched: dict[str, Path] = {}

        def get(rel: str) -> Path:
            if rel not in fetched:
                fetched[rel] = Path(huggingface_hub.hf_hub_download(
                    self.model, rel, etag_timeout=self.hub_timeout, tqdm_class=self._bar_class(),
                    endpoint=endpoint))
                self._touch()
            return fetched[rel]

        needs = needs_for(self.kind, lambda rel: rel in sizes, lambda rel: json.loads(get(rel).read_text()))
        absent = [n.path for n in needs if n.path not in sizes]
        if absent:
            raise BrokenModelFile(tr("the Hub repository {model} lacks needed file(s): {files}",
                                     model=self.model, files=_listed(absent, 12)))
        wanted = [n.path for n in needs] + self._extras(sizes, get)
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        snapshot = (Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=self.model, repo_type="model")
                    / "snapshots" / str(info.sha))
        todo = [rel for rel in wanted if rel not in fetched and not (snapshot / rel).is_file()]
        with self._lock:
            self.files = todo
            self.total_bytes = sum(sizes.get(rel, 0) for rel in todo)
        for rel in todo:
            get(rel)
        folder = cached_snapshot(self.model) or snapshot
        still = _missing(folder, self.kind)
        if still:
            raise BrokenModelFile(tr("after the download {folder} still lacks {files}",
                                     folder=folder, files=_listed(still, 12)))
        return folder

    def _extras(self, sizes: dict[str, int], get) -> list[str]:
        """Optional files fetched when the repo has them: generation config, tokenizer extras, and
        (like DiffusionPipeline.download) every file of a pipeline's non-model folders."""
        if self.kind == "chat":
            return [name for name in CHAT_EXTRAS if name in sizes]
        index = json.loads(get("model_index.json").read_text())
        folders = [name for name, (lib, cls) in pipeline_components(index).items()
                   if component_kind(lib, cls) != "model"]
        return sorted(rel for rel in sizes if rel.split("/")[0] in folders and "/" in rel)

    def _bar_class(self):
        """A tqdm stand-in that huggingface_hub feeds with bytes as they arrive (no console output)."""
        download = self

        class _Bar:
            def __init__(self, *args, total=None, initial=0, **kwargs):
                self.total, self.n = total, initial
                if initial:
                    download._touch(initial)  # resumed from an .incomplete blob

            def update(self, n=1):
                self.n += n or 0
                download._touch(int(n or 0))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def __getattr__(self, name):  # set_postfix_str, refresh, close, update_transfer, ...
                return lambda *args, **kwargs: None

        return _Bar
