"""Model weights: which files a model needs, where they are, whether they are whole, and fetching the rest.

A model is a local folder or a Hub id at a revision (None: main), looked up in the local Hugging Face
cache; ``obtain`` fetches only what its snapshot lacks, one file at a time with ``hf_hub_download``, every
call naming the revision and bounded in time (offline: no network at all). Only safetensors weights are
supported. Which files count, and the timeouts: docs/weights.md.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import EngineUnavailableError
from .messages import joined, said, tr

_COMMIT_RE = re.compile(r"[0-9a-f]{40}")  # a full commit sha: the name of a snapshot folder
Exists = Callable[[str], bool]
ReadJson = Callable[[str], dict]
ProgressFn = Callable[[float, str], None]

CHAT_EXTRAS = ("generation_config.json", "special_tokens_map.json", "added_tokens.json",
               "chat_template.jinja")  # fetched when the repo has them; never required
_WEIGHTS = {"diffusers": "diffusion_pytorch_model.safetensors", "transformers": "model.safetensors"}


@dataclass(frozen=True)
class Need:
    """One file a model needs; ``why`` says what it is for (shown when it is missing)."""

    path: str
    why: str


class BrokenModelFile(Exception):
    """A file is present but unusable; the message names the file and the cause, ``problem`` the cause alone."""

    problem: str = ""


def broken(file: str, problem: str) -> BrokenModelFile:
    """"<file>: <problem>" (a message: the page shows it in its language)."""
    exc = BrokenModelFile(tr("{file}: {problem}", file=file, problem=problem))
    exc.problem = problem
    return exc


# ----- which files a model needs ---------------------------------------------------------------

def _tokenizer_needs(folder: str, exists: Exists, what: str) -> list[Need]:
    def at(name: str) -> str:
        return f"{folder}/{name}" if folder else name

    needs = [Need(at("tokenizer_config.json"), tr("{what} settings", what=what))]
    if exists(at("tokenizer.json")) or not exists(at("vocab.json")):
        return [*needs, Need(at("tokenizer.json"), what)]
    return [*needs, Need(at("vocab.json"), what), Need(at("merges.txt"), what)]


def _weight_needs(folder: str, single: str, exists: Exists, read_json: ReadJson, what: str) -> list[Need]:
    """The index and every shard it names, or the single weights file."""
    prefix = f"{folder}/" if folder else ""
    index = prefix + single.replace(".safetensors", ".safetensors.index.json")
    if not exists(index):
        return [Need(prefix + single, tr("{what} weights", what=what))]
    try:
        shards = sorted(set(read_json(index)["weight_map"].values()))
    except (KeyError, TypeError, AttributeError) as exc:
        raise broken(index, tr("not a safetensors index (no weight_map: {error})", error=repr(exc))) from None
    return [Need(index, tr("{what} weight index", what=what)),
            *(Need(prefix + s, tr("{what} weight shard", what=what)) for s in shards)]


def component_kind(library: str, class_name: str) -> str:
    """'scheduler', 'tokenizer', 'processor' or 'model' for a model_index.json entry."""
    if class_name.endswith("Scheduler"):
        return "scheduler"
    if "Tokenizer" in class_name:
        return "tokenizer"
    return "processor" if class_name.endswith(("Processor", "FeatureExtractor")) else "model"


def pipeline_components(model_index: dict) -> dict[str, tuple[str, str]]:
    """Component name -> (library, class) for every component model_index.json enables (diffusers' rule,
    written out: its helpers import torch, and this runs before the compile cache is configured)."""
    return {name: (str(value[0]), str(value[1])) for name, value in model_index.items()
            if not name.startswith("_") and isinstance(value, list | tuple) and len(value) == 2
            and None not in value}


def needs_for(kind: str, exists: Exists, read_json: ReadJson) -> list[Need]:
    """The files a ``kind`` ("chat" or "image") model needs, given what exists where."""
    if kind == "chat":
        model = tr("model")
        return [Need("config.json", tr("{what} config", what=model)), *_tokenizer_needs("", exists, tr("tokenizer")),
                *_weight_needs("", _WEIGHTS["transformers"], exists, read_json, model)]
    needs = [Need("model_index.json", tr("pipeline index"))]
    if not exists("model_index.json"):
        return needs
    for name, (library, class_name) in pipeline_components(read_json("model_index.json")).items():
        what = f"{name} ({class_name})"
        kind = component_kind(library, class_name)
        if kind == "tokenizer":
            needs += _tokenizer_needs(name, exists, what)
        elif kind in ("scheduler", "processor"):
            config = "scheduler_config.json" if kind == "scheduler" else "preprocessor_config.json"
            needs.append(Need(f"{name}/{config}", tr("{what} config", what=what)))
        else:
            needs.append(Need(f"{name}/config.json", tr("{what} config", what=what)))
            needs += _weight_needs(name, _WEIGHTS.get(library, _WEIGHTS["transformers"]), exists, read_json, what)
    return needs


def read_json_file(folder: Path, rel: str) -> dict:
    """Parse ``folder/rel``; BrokenModelFile names the file and the cause."""
    try:
        data = json.loads((Path(folder) / rel).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise broken(rel, tr("unreadable JSON ({error})", error=str(exc))) from None
    if not isinstance(data, dict):
        raise broken(rel, tr("expected a JSON object, found {type}", type=type(data).__name__))
    return data


def folder_needs(folder: Path, kind: str) -> list[Need]:
    """The files a local model folder (or cached snapshot) needs; raises BrokenModelFile for a bad index."""
    folder = Path(folder)
    return needs_for(kind, lambda rel: (folder / rel).is_file(), lambda rel: read_json_file(folder, rel))


def missing_in_folder(folder: Path | None, kind: str) -> list[str]:
    """Needed files absent from ``folder`` (no folder: all of its top-level needs); [] when complete.

    A cached snapshot's files are links into ``blobs/``: a link whose blob is gone counts as missing.
    """
    if folder is None or not Path(folder).is_dir():
        return [n.path for n in needs_for(kind, lambda rel: False, lambda rel: {})]
    return [n.path for n in folder_needs(folder, kind) if not (Path(folder) / n.path).is_file()]


def _missing(folder: Path | None, kind: str) -> list[str]:
    try:
        return missing_in_folder(folder, kind)
    except BrokenModelFile as exc:
        return [said(exc)]


# ----- whether the present files are whole -----------------------------------------------------

def tensor_shapes(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Each tensor's (dtype, shape) of a safetensors file, read by safetensors itself (no tensor data read).

    Raises BrokenModelFile naming the file: a file shorter than its header says (a truncated download), or
    a header that is not a safetensors header."""
    from safetensors import SafetensorError, safe_open  # numpy framework: imports no torch

    path = Path(path)
    try:
        with safe_open(path, "numpy") as handle:
            return {name: (handle.get_slice(name).get_dtype(), handle.get_slice(name).get_shape())
                    for name in handle.keys()}
    except SafetensorError as exc:
        said_by_library = str(exc).removeprefix("Error while deserializing header: ")
        if any(cause in said_by_library for cause in TRUNCATED):
            raise broken(path.name, tr("truncated ({size} bytes; an interrupted download?)",
                                       size=f"{path.stat().st_size:,}")) from None
        raise broken(path.name, tr("corrupt safetensors header ({error})", error=said_by_library)) from None


# What safetensors says of a file shorter than its header declares (its data, or the header itself).
TRUNCATED = ("incomplete metadata", "header too small", "invalid header length")


def verify_folder(folder: Path, kind: str) -> list[str]:
    """Problems of a model folder, one line per file: missing files, unreadable configs, truncated weights.

    Every component folder is checked (not only the first broken one); [] means loadable as far
    as the files can tell without loading them.
    """
    folder = Path(folder)
    try:
        needs = folder_needs(folder, kind)
    except BrokenModelFile as exc:
        return [said(exc)]
    problems = []
    for need in needs:
        path, top = folder / need.path, need.path.split("/")[0]
        if not path.is_file():
            gone = "/" in need.path and not (folder / top).is_dir()
            problems.append(tr("{path}: missing ({why}; the {top}/ folder is absent)", path=need.path, why=need.why,
                               top=top) if gone else tr("{path}: missing ({why})", path=need.path, why=need.why))
            continue
        try:
            if path.suffix == ".json":
                read_json_file(folder, need.path)
            elif path.suffix == ".safetensors":
                tensor_shapes(path)
        except BrokenModelFile as exc:
            problems.append(tr("{file}: {problem}", file=need.path, problem=exc.problem))
    return problems


def weight_files(folder: Path, kind: str) -> dict[str, list[Path]]:
    """Safetensors files per component ("" for a chat model's own weights)."""
    out: dict[str, list[Path]] = {}
    for need in folder_needs(folder, kind):
        if need.path.endswith(".safetensors"):
            out.setdefault(need.path.rpartition("/")[0], []).append(Path(folder) / need.path)
    return out


# ----- where they are: a folder, the local Hugging Face cache, the Hub -------------------------

def local_folder(model: str) -> Path | None:
    """The folder ``model`` names, or None when it is a hub id."""
    path = Path(model).expanduser()
    return path if path.is_dir() else None


def check_folder(path: Path) -> None:
    """Raise EngineUnavailableError when a model folder lacks its config."""
    if not any((path / marker).is_file() for marker in ("config.json", "model_index.json")):
        raise EngineUnavailableError(tr("Model folder {path} has no config.json or model_index.json: point "
                                        "--chat-model/--image-model at a folder saved with "
                                        "save_pretrained().", path=path))


def kind_of_folder(path: Path) -> str:
    """'image' for a diffusers pipeline folder (model_index.json), else 'chat'."""
    return "image" if (Path(path) / "model_index.json").is_file() else "chat"


def cached_snapshot(model: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of ``model`` at ``revision`` in the local Hugging Face cache, or None.

    A partial snapshot is returned too (huggingface_hub's IncompleteSnapshotError carries its path);
    what it lacks is for ``missing_files`` to say. ``revision`` None is main. Never touches the network.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model, revision=revision or "main", local_files_only=True))
    except IncompleteSnapshotError as exc:
        return Path(exc.snapshot_path)
    except (LocalEntryNotFoundError, HFValidationError):  # not cached; not a repo id (a folder that is not there)
        return None


def in_local_cache(model: str, revision: str | None = None) -> Path | None:
    """The cached snapshot of a hub id when it holds every needed file, else None."""
    snapshot = cached_snapshot(model, revision)
    return snapshot if snapshot is not None and not _missing(snapshot, kind_of_folder(snapshot)) else None


def file_on_disk(model: str, rel: str, revision: str | None = None) -> Path | None:
    """``rel`` of ``model`` where it already is on this machine (its folder, or the Hugging Face cache at
    ``revision``), else None. Never touches the network; cheap enough for a status poll (a few stat calls)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    folder = local_folder(model)
    if folder is not None:
        return folder / rel if (folder / rel).is_file() else None
    try:
        found = try_to_load_from_cache(model, rel, revision=revision)
    except (HFValidationError, ValueError, OSError):  # not a repo id (a folder that is not there)
        return None
    return Path(found) if isinstance(found, str) else None


def snapshot_revision(folder: Path | None) -> str | None:
    """The commit sha a folder of the Hugging Face cache was loaded from (``snapshots/<sha>``), else None."""
    if folder is None or Path(folder).parent.name != "snapshots" or not _COMMIT_RE.fullmatch(Path(folder).name):
        return None
    return Path(folder).name


def model_ref(model: str, revision: str | None) -> str:
    """``model@revision`` as the flags take it; the model alone for main or a local folder."""
    return f"{model}@{revision}" if revision else model


def missing_files(model: str, kind: str, revision: str | None = None) -> list[str]:
    """Which needed files of ``model`` ("chat" or "image"; a hub id at ``revision`` in the local cache, or a
    folder) are missing locally, never using the network; [] when all are there, the top-level needs
    (``config.json`` ... or ``model_index.json``) when it is not cached at all."""
    return _missing(local_folder(model) or cached_snapshot(model, revision), kind)


def _listed(names: list[str], limit: int = 6) -> str:
    shown = joined(names[:limit])
    return tr("{shown} and {n} more", shown=shown, n=len(names) - limit) if len(names) > limit else shown


def _hub_reachable(model: str, timeout: float, revision: str | None = None) -> tuple[bool, str]:
    """Ask the Hub about ``model``, giving up after ``timeout`` seconds whatever happens (a DNS look-up too)."""
    import huggingface_hub

    if huggingface_hub.constants.is_offline_mode():
        return False, tr("HF_HUB_OFFLINE is set")
    result: list[tuple[bool, str]] = []

    def ask() -> None:
        try:
            api = huggingface_hub.HfApi(endpoint=huggingface_hub.constants.ENDPOINT)
            api.model_info(model, revision=revision, timeout=timeout)
            result.append((True, tr("the Hub is reachable")))
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            result.append((False, tr("the Hub is unreachable ({kind})", kind=type(exc).__name__)))

    thread = threading.Thread(target=ask, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return result[0] if result else (False, tr("the Hub did not answer within {timeout}s", timeout=f"{timeout:g}"))


def weights_available(model: str, timeout: float, kind: str | None = None,
                      revision: str | None = None) -> tuple[bool, str]:
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
    snapshot = cached_snapshot(model, revision)
    missing = _missing(snapshot, kind or "chat")
    shown = model_ref(model, revision)
    if not missing:
        return True, tr("{model} is in the local Hugging Face cache", model=shown)
    where = tr("is not in the local Hugging Face cache") if snapshot is None else tr(
        "lacks {n} needed file(s) in the local Hugging Face cache ({files})", n=len(missing), files=_listed(missing))
    ok, hub = _hub_reachable(model, timeout, revision)
    if ok:
        return True, tr("{model} {where}; they will be downloaded ({hub})", model=shown, where=where, hub=hub)
    return False, tr("{model} {where} and {hub}", model=shown, where=where, hub=hub)


def obtain(model: str, progress: ProgressFn | None = None, kind: str | None = None, *,
           hub_timeout: float = 10.0, stall_timeout: float = 60.0, flag: str = "--chat-model",
           revision: str | None = None) -> Path:
    """Return a local folder holding every file ``model`` (a hub id at ``revision``) needs, each one whole,
    downloading only the missing; ``progress(fraction, text)`` as bytes arrive. Raises EngineUnavailableError
    naming every missing, damaged or unfetchable file (offline, Hub unreachable, stalled) and what to do."""
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
    else:
        kind = kind or "chat"
        folder = cached_snapshot(model, revision)
        missing = _missing(folder, kind)
        if folder is None or missing:
            import huggingface_hub

            if huggingface_hub.constants.is_offline_mode():
                raise EngineUnavailableError(tr(
                    "{model}: {n} needed file(s) are not in the local Hugging Face cache ({files}) and HF_HUB_OFFLINE "
                    "is set. Go online, or fetch them elsewhere with `{command}` and pass the folder with {flag}.",
                    model=model_ref(model, revision), n=len(missing), files=_listed(missing, 12),
                    command=_hf_download_command(model, missing, revision), flag=flag))
            folder = _Download(model, kind, progress, hub_timeout, stall_timeout, flag, revision).run()
    problems = verify_folder(folder, kind)
    if problems:
        raise EngineUnavailableError(tr(
            "{model} in {folder} has damaged or missing files: {problems}. Fetch them again (`{command}`) or pass a "
            "complete folder with {flag}.", model=model_ref(model, revision), folder=folder,
            problems=joined(problems[:12], "{a}; {b}"),
            command=_hf_download_command("<repo>" if local_folder(model) else model, [], revision), flag=flag))
    return folder


def _hf_download_command(model: str, files: list[str], revision: str | None = None) -> str:
    pinned = f" --revision {revision}" if revision else ""
    if not files or len(files) > 8 or any(":" in f for f in files):
        return f"hf download {model}{pinned} --local-dir <folder>"
    return f"hf download {model} {' '.join(files)}{pinned} --local-dir <folder>"


# ----- fetching what is missing ----------------------------------------------------------------

class _Download:
    """Fetch the files ``model`` needs on a worker thread that only touches the counters (under ``_lock``); the
    caller polls them and gives up after ``stall_timeout`` s without progress, leaving the daemon worker to
    huggingface_hub's own timeouts."""

    def __init__(self, model, kind, progress, hub_timeout, stall_timeout, flag, revision=None):
        self.model, self.kind, self.progress, self.revision = model, kind, progress, revision
        self.hub_timeout, self.stall_timeout, self.flag = hub_timeout, stall_timeout, flag
        self._lock = threading.Lock()
        self.done_bytes, self.total_bytes, self.files = 0, None, []
        self.last_activity = self.started = time.monotonic()
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
                    "`{command}` and pass the folder with {flag}, or raise --hub-timeout.",
                    model=model_ref(self.model, self.revision),
                    timeout=f"{self.stall_timeout:g}", amount=self._amount(),
                    command=self._command(), flag=self.flag))
        if self.error is not None:
            raise EngineUnavailableError(tr(
                "Could not download {model} ({kind}: {error}). Check the network or HF_TOKEN, or fetch it with "
                "`{command}` and pass the folder with {flag}; --models tiny runs the demo models.",
                model=model_ref(self.model, self.revision), kind=type(self.error).__name__, error=said(self.error),
                command=self._command(), flag=self.flag)) from self.error
        assert self.result is not None
        return self.result

    def _command(self) -> str:
        return _hf_download_command(self.model, self.files, self.revision)

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
                                                 done=f"{done / 1e9:.2f}", total=f"{total / 1e9:.2f}",
                                                 rate=f"{rate / 1e6:.1f}", files=len(self.files)))

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
        info = huggingface_hub.HfApi(endpoint=endpoint).model_info(self.model, revision=self.revision,
                                                                   files_metadata=True, timeout=self.hub_timeout)
        self._touch()
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
        fetched: dict[str, Path] = {}

        def get(rel: str) -> Path:
            if rel not in fetched:
                fetched[rel] = Path(huggingface_hub.hf_hub_download(
                    self.model, rel, revision=self.revision, etag_timeout=self.hub_timeout,
                    tqdm_class=_counting_bar(self._touch), endpoint=endpoint))
                self._touch()
            return fetched[rel]

        needs = needs_for(self.kind, lambda rel: rel in sizes, lambda rel: json.loads(get(rel).read_text()))
        absent = [n.path for n in needs if n.path not in sizes]
        if absent:
            raise BrokenModelFile(tr("the Hub repository {model} lacks needed file(s): {files}",
                                     model=model_ref(self.model, self.revision), files=_listed(absent, 12)))
        wanted = [n.path for n in needs] + self._extras(sizes, get)
        todo = [rel for rel in wanted if rel not in fetched and not isinstance(
            huggingface_hub.try_to_load_from_cache(self.model, rel, revision=info.sha), str)]
        with self._lock:
            self.files, self.total_bytes = todo, sum(sizes.get(rel, 0) for rel in todo)
        for rel in todo or wanted[:1]:  # one call at least: it records refs/<revision> for the next start offline
            get(rel)
        folder = cached_snapshot(self.model, revision=str(info.sha))
        still = _missing(folder, self.kind)
        if folder is None or still:
            raise BrokenModelFile(tr("after the download {folder} still lacks {files}",
                                     folder=folder or self.model, files=_listed(still, 12)))
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


def _counting_bar(touch: Callable[[int], None]) -> type:
    """A silent tqdm stand-in that huggingface_hub feeds: ``update`` counts the bytes written;
    ``update_transfer`` (the same bytes off the wire) only marks activity, and having it makes a xet
    download report through this one bar instead of a second one."""

    class _Bar:
        def __init__(self, *args, total=None, initial=0, **kwargs):
            self.total, self.n = total, 0
            self.update(initial)  # resumed from an .incomplete blob

        def update(self, n=1):
            self.n += n or 0
            touch(int(n or 0))

        def update_transfer(self, n=1):
            touch(0)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __getattr__(self, name):  # set_postfix_str, set_transfer_postfix_str, refresh, close, ...
            return lambda *args, **kwargs: None

    return _Bar
