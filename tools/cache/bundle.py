"""Export a compile cache as one archive with its manifest; install one, checked, before warm-up.

Archive layout (a tar, gzip-compressed): ``manifest.json`` (see ``manifest.py``, plus ``files``:
path -> sha256 and bytes) and ``files/<path>`` for every file of ``<cache root>/compile-cache``
(NEFFs under ``neff/``, inductor's cache under ``inductor/``, torch's portable artifacts in
``torch-artifacts.bin``).

A bundle is code: inductor's FX-graph and AOTAutograd cache entries are pickles, loaded (and so run)
in this process when warm-up looks a graph up, and NEFFs are device programs. The manifest travels
inside the archive, so its checks prove consistency, not origin. The origin is checked by a pin: the
operator passes the sha256 of the whole archive (``--cache-bundle-sha256``, printed by ``export``
where the bundle is made); ``install`` refuses an unpinned bundle before it is fetched or opened, and
an archive whose sha256 differs before anything is extracted. The archive is hashed and read through
one open file, so the bytes checked are the bytes installed.

Past the pin, installing still checks the archive: only regular, non-sparse files, relative paths
inside ``files/`` (none both a file and a folder, none a name export never packs), no links, bounded
sizes and member count, room for the declared sizes on the disk, every member read only up to its
declared size, every file's sha256 checked against the manifest and the manifest's list checked
against the archive, all before anything is written to the cache. Files
are verified in a staging folder inside the cache root; every target is checked (no link, no
non-folder on the way, no folder in its place) before the first move; files are then moved into place
one by one (``os.replace``), and a failed move puts back what the earlier ones replaced: a refused
archive leaves the cache as it was.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from neuron_backend.errors import CacheBundleError
from neuron_backend.messages import joined, tr

from . import manifest as manifests

log = logging.getLogger("showcase.cache")

MANIFEST = "manifest.json"
ARTIFACTS = "torch-artifacts.bin"
LIVE_MANIFEST = "manifest.json"  # written by the app next to the cache it describes
SKIP_NAMES = {".write-test", LIVE_MANIFEST}
MAX_BUNDLE_BYTES = 64 * 1024**3  # the archive on disk
MAX_TOTAL_BYTES = 128 * 1024**3  # its files, unpacked
MAX_FILES = 200_000
MAX_MANIFEST_BYTES = 32 * 1024**2
CHUNK = 1024 * 1024
FREE_MARGIN_BYTES = 256 * 1024**2  # left free on the cache's disk after staging
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class InstallReport:
    """What a bundle brought: usable shapes per engine, mismatches by field, files written."""

    source: str
    usable: dict[str, list[str]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    total_graphs: int = 0
    installed_files: int = 0
    present_files: int = 0
    artifacts: bytes | None = None

    @property
    def usable_graphs(self) -> int:
        return sum(len(s) for s in self.usable.values())

    def summary(self) -> str:
        """"3 of 4 graphs usable; <mismatches>; 12 files installed, 0 already present" (a message)."""
        return joined([tr("{usable} of {total} graphs usable", usable=self.usable_graphs, total=self.total_graphs),
                       *self.mismatches, tr("{installed} files installed, {present} already present",
                                            installed=self.installed_files,
                                              present=self.present_files)], "{a}; {b}")


def cache_folder(cache_root: Path) -> Path:
    return Path(cache_root) / "compile-cache"


def _sha256_of(f) -> str:
    digest = hashlib.sha256()
    while chunk := f.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return _sha256_of(f)


def archive_sha256(path: Path) -> str:
    """The sha256 of a whole bundle archive: what ``--cache-bundle-sha256`` pins."""
    return _sha256(Path(path))


def _free_bytes(folder: Path) -> int:
    """Free bytes on the disk of ``folder`` (or of its nearest existing parent)."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _temporary(name: str) -> bool:
    """A file or folder name of a write in progress: ``x.tmp``, ``x.tmp.<pid>``, ``.tmp<random>``."""
    return name.endswith(".tmp") or ".tmp." in name or name.startswith(".tmp")


def _not_carried(rel: str) -> bool:
    """Whether a cache-relative path is one a bundle never carries: the live manifest and the write probe at
    the top, staging folders (``.bundle-*``), locks, and temporary files or anything in a temporary folder.
    Export skips them; install refuses them."""
    parts = PurePosixPath(rel).parts
    return (len(parts) == 1 and parts[0] in SKIP_NAMES) or parts[0].startswith(".bundle-") \
        or rel.endswith(".lock") or any(_temporary(part) for part in parts)


def _cache_files(folder: Path) -> list[Path]:
    """Regular files of the cache worth carrying (no locks, probes, staging or the live manifest)."""
    return [path for path in sorted(folder.rglob("*"))
            if not path.is_symlink() and path.is_file() and not _not_carried(path.relative_to(folder).as_posix())]


def write_live_manifest(cache_root: Path, described: dict, artifacts: bytes | None) -> Path:
    """Record what this cache was built for (and torch's portable artifacts) once warm-up ends.

    A file whose bytes are already those is left untouched, so its modification time (and the
    cache's ``fingerprint``) changes only when the content does.
    """
    folder = cache_folder(cache_root)
    folder.mkdir(parents=True, exist_ok=True)
    if artifacts:
        _write_if_changed(folder / ARTIFACTS, artifacts)
    described = dict(described, torch_artifacts=ARTIFACTS if (folder / ARTIFACTS).exists() else None)
    try:
        kept = json.loads((folder / LIVE_MANIFEST).read_text())
    except (OSError, ValueError):
        kept = None
    if isinstance(kept, dict) and _without_time(kept) == _without_time(json.loads(json.dumps(described))):
        return folder / LIVE_MANIFEST  # the same cache: its recorded time stays the first one
    _write_if_changed(folder / LIVE_MANIFEST, json.dumps(described, indent=1, sort_keys=True).encode())
    return folder / LIVE_MANIFEST


def _without_time(described: dict) -> dict:
    return {k: v for k, v in described.items() if k != "created_at"}


def _write_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def fingerprint(cache_root: Path) -> str:
    """A short hash of what ``export`` would pack: every cache file's path, size and modification time,
    and the live manifest's bytes (reads no cache file, so it is cheap on a cache of gigabytes)."""
    folder = cache_folder(cache_root)
    digest = hashlib.sha256()
    try:
        digest.update((folder / LIVE_MANIFEST).read_bytes())
    except OSError:
        pass
    for path in _cache_files(folder):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


class _Capped(io.RawIOBase):
    """A write-only file that refuses to grow past ``limit`` bytes (CacheBundleError naming the limit)."""

    def __init__(self, f, limit: int):
        self.f, self.limit, self.written = f, limit, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.written += len(data)
        if self.written > self.limit:
            raise CacheBundleError(tr("The compile cache packs into more than {limit} bytes, the bound of the exports "
                                      "folder: export it on the server with python -m tools.cache "
                                      "export OUT.tar.gz.", limit=self.limit))
        return self.f.write(data)


def export(cache_root: Path, out: Path, max_bytes: int | None = None) -> dict:
    """Pack ``<cache_root>/compile-cache`` and its manifest into ``out`` (a .tar.gz); return the manifest.

    With ``max_bytes`` the archive may not grow past it: the export stops there (CacheBundleError) and
    ``out`` is not written.
    """
    folder = cache_folder(cache_root)
    live = folder / LIVE_MANIFEST
    if not live.is_file():
        raise CacheBundleError(tr("{folder} has no {manifest}: start the app once with the settings the bundle is for "
                                  "and let warm-up finish (it writes the "
                                  "manifest), then export.", folder=folder, manifest=LIVE_MANIFEST))
    described = json.loads(live.read_text())
    files = {}
    for path in _cache_files(folder):
        files[path.relative_to(folder).as_posix()] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
    described["files"] = files
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open(tmp, "wb") as raw:
            sink = raw if max_bytes is None else _Capped(raw, max_bytes)
            with tarfile.open(fileobj=sink, mode="w:gz", compresslevel=3) as tar:
                data = json.dumps(described, indent=1, sort_keys=True).encode()
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
                for rel in files:
                    tar.add(folder / rel, arcname=f"files/{rel}", recursive=False)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("exported %d files of %s to %s", len(files), folder, out)
    return described


def _member_path(name: str) -> str:
    """The cache-relative path of an archive member, or CacheBundleError when it could escape."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or not path.parts or path.parts[0] != "files" \
            or len(path.parts) < 2:
        raise CacheBundleError(tr("refused: archive member {name} is outside files/ (paths must stay in the cache)",
                                  name=repr(name)))
    rel = PurePosixPath(*path.parts[1:]).as_posix()
    if _not_carried(rel):
        raise CacheBundleError(tr("refused: archive member {name} is a name a bundle never carries (the cache's "
                                  "own manifest.json, .write-test, .bundle-* staging folders, .lock and .tmp "
                                  "files)", name=repr(name)))
    return rel


def read_manifest(tar: tarfile.TarFile) -> tuple[dict, dict[str, tarfile.TarInfo]]:
    """The bundle's manifest and its file members, after checking every member's kind, path and size."""
    members, found, total = {}, None, 0
    for count, info in enumerate(tar, start=1):
        if count > MAX_FILES + 1:
            raise CacheBundleError(tr("refused: more than {n} files in the archive", n=MAX_FILES))
        if info.isdir():
            continue
        if not info.isfile():  # symlinks, hard links, devices, fifos
            raise CacheBundleError(tr("refused: archive member {name} is not a regular file", name=repr(info.name)))
        if info.issparse() or any(k.startswith("GNU.sparse") for k in info.pax_headers):
            raise CacheBundleError(tr("refused: archive member {name} is a sparse file", name=repr(info.name)))
        if info.name == MANIFEST:
            if info.size > MAX_MANIFEST_BYTES:
                raise CacheBundleError(tr("refused: {manifest} is {size} bytes (at most {limit})",
                                          manifest=MANIFEST, size=info.size,
                                           limit=MAX_MANIFEST_BYTES))
            found = info
            continue
        total += info.size
        if total > MAX_TOTAL_BYTES:
            raise CacheBundleError(tr("refused: the files add up to more than {limit} bytes", limit=MAX_TOTAL_BYTES))
        members[_member_path(info.name)] = info
    folders = {parent.as_posix() for rel in members for parent in PurePosixPath(rel).parents}
    if clashes := sorted(folders & set(members)):
        raise CacheBundleError(tr("refused: {rel} is both a file and a folder in the archive", rel=clashes[0]))
    if found is None:
        raise CacheBundleError(tr("refused: no {manifest} in the archive (not a bundle made by python -m tools.cache "
                                  "export)", manifest=MANIFEST))
    try:
        described = json.loads(tar.extractfile(found).read())
    except ValueError as exc:
        raise CacheBundleError(tr("refused: {manifest} is not valid JSON ({error})",
                                  manifest=MANIFEST, error=str(exc))) from None
    if not isinstance(described, dict) or described.get("format") != manifests.FORMAT \
            or not isinstance(described.get("files"), dict) or not isinstance(described.get("engines"), dict):
        raise CacheBundleError(tr("refused: {manifest} is not a format-{format} bundle manifest",
                                  manifest=MANIFEST, format=manifests.FORMAT))
    listed, packed = set(described["files"]), set(members)
    if listed != packed:
        odd = sorted(listed ^ packed)[:3]
        raise CacheBundleError(tr("refused: the manifest and the archive disagree on {n} files (e.g. {examples})",
                                  n=len(listed ^ packed), examples=", ".join(odd)))
    return described, members


def resolve_source(source: str, timeout: float = 30.0) -> Path:
    """A local archive for ``source``: a file, a folder holding one archive, or hf://owner/repo[@revision]."""
    if source.startswith("hf://"):
        repo, _, revision = source.removeprefix("hf://").partition("@")
        try:
            from huggingface_hub import snapshot_download

            folder = snapshot_download(repo, revision=revision or None, etag_timeout=timeout,
                                       allow_patterns=["*.tar", "*.tar.gz", "*.tgz"])
        except Exception as exc:  # noqa: BLE001 - offline, missing repo, auth: all said plainly
            raise CacheBundleError(tr("cannot fetch the bundle {source} from the Hub ({kind}: {error}); download it "
                                      "yourself and pass the file with "
                                      "--cache-bundle PATH", source=source, kind=type(exc).__name__,
                                       error=str(exc))) from None
        return resolve_source(folder)
    path = Path(source).expanduser()
    if path.is_dir():
        archives = sorted(p for p in path.iterdir() if p.name.endswith((".tar", ".tar.gz", ".tgz")))
        if len(archives) != 1:
            raise CacheBundleError(tr("--cache-bundle: {path} holds {n} archives; pass one .tar.gz file",
                                      path=path, n=len(archives)))
        path = archives[0]
    if not path.is_file():
        raise CacheBundleError(tr("--cache-bundle: {path} does not exist (a .tar.gz from python -m tools.cache "
                                  "export, a folder holding one, or hf://owner/repo)", path=path))
    if path.stat().st_size > MAX_BUNDLE_BYTES:
        raise CacheBundleError(tr("refused: {path} is {size} bytes (at most {limit})",
                                  path=path, size=path.stat().st_size, limit=MAX_BUNDLE_BYTES))
    return path


def install(source: str, here: Mapping, cache_root: Path, sha256: str | None) -> InstallReport:
    """Check the bundle's origin (``sha256`` of the archive), then its manifest against this server's
    manifest ``here``; install what fits; report by field.

    Raises CacheBundleError (nothing written) without a pin (before fetching or opening anything), for
    an archive whose sha256 is not the pin, for a bad archive, or when no graph in it fits here.
    """
    pin = (sha256 or "").strip().lower()
    if not SHA256_RE.match(pin):
        raise CacheBundleError(tr("refused {source}: a bundle is code (inductor's cache entries are pickles that run "
                                  "when warm-up looks a graph up); pass --cache-bundle-sha256 <sha256 of the "
                                  "archive>, as python -m tools.cache export printed it where the bundle was made "
                                  "(python -m tools.cache show PATH prints it too)", source=source))
    path = resolve_source(source)
    folder = cache_folder(cache_root)
    with open(path, "rb") as archive:  # one open file: the bytes hashed are the bytes read
        actual = _sha256_of(archive)
        if actual != pin:
            raise CacheBundleError(tr("refused: {name} has sha256 {actual}, not the pinned {pinned} "
                                      "(--cache-bundle-sha256); it is not the archive that was pinned, nothing "
                                      "installed", name=path.name, actual=actual, pinned=pin))
        archive.seek(0)
        try:
            tar = tarfile.open(fileobj=archive, mode="r:*")
        except (tarfile.TarError, OSError) as exc:
            raise CacheBundleError(tr("refused: {name} is not a readable tar archive ({error})",
                                      name=path.name, error=str(exc))) from None
        with tar:
            described, members = read_manifest(tar)
            report = InstallReport(str(source))
            report.usable, report.mismatches, report.total_graphs = manifests.compare(described, here)
            if not report.usable_graphs:
                raise CacheBundleError(tr("nothing installed from {name}: {summary}",
                                          name=path.name, summary=report.summary()))
            need, free = sum(info.size for info in members.values()), _free_bytes(folder)
            if need + FREE_MARGIN_BYTES > free:
                raise CacheBundleError(tr("refused: {name} unpacks to {need} bytes; the cache's disk has {free} bytes "
                                          "free ({margin} must stay free)", name=path.name, need=need, free=free,
                                           margin=FREE_MARGIN_BYTES))
            folder.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".bundle-", dir=folder))
            try:
                for rel, info in members.items():
                    try:
                        _stage(tar, info, rel, described["files"][rel], staging)
                    except OSError as exc:  # said without the server's paths
                        raise CacheBundleError(tr("could not stage {rel} ({error}); nothing installed", rel=rel,
                                                  error=exc.strerror or type(exc).__name__)) from None
                report.installed_files, report.present_files = _move_into_place(staging, folder,
                                                                                described["files"])
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    artifacts = folder / ARTIFACTS
    if described.get("torch_artifacts") == ARTIFACTS and artifacts.is_file():
        report.artifacts = artifacts.read_bytes()
    log.info("cache bundle %s (sha256 %s): %s", path.name, actual, report.summary())
    return report


def _stage(tar: tarfile.TarFile, info: tarfile.TarInfo, rel: str, expected: Mapping, staging: Path) -> None:
    """Copy one member to the staging folder, reading no more than its declared size, checking its sha256."""
    if not isinstance(expected, Mapping) or expected.get("bytes") != info.size:
        raise CacheBundleError(tr("refused: {rel} is {size} bytes, the manifest says {expected}",
                                  rel=rel, size=info.size, expected=expected.get("bytes")))
    target = staging / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    source = tar.extractfile(info)
    remaining = info.size
    with open(target, "wb") as out:
        while remaining:
            chunk = source.read(min(CHUNK, remaining))
            if not chunk:  # the archive ends before the declared size
                raise CacheBundleError(tr("refused: {rel} is {size} bytes, the manifest says {expected}",
                                          rel=rel, size=info.size - remaining,
                                           expected=info.size))
            remaining -= len(chunk)
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected.get("sha256"):
        raise CacheBundleError(tr("refused: {rel} does not match its sha256 in the manifest (corrupt or tampered)",
                                  rel=rel))


def _check_target(folder: Path, rel: str) -> None:
    """Refuse a target reached through a link or a non-folder, or with a link or folder in its place."""
    path = folder
    for part in PurePosixPath(rel).parts[:-1]:
        path = path / part
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise CacheBundleError(tr("refused: {rel} cannot be written in the cache: {path} is a link or not a "
                                      "folder/file as expected; nothing installed", rel=rel, path=path))
    target = folder / rel
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise CacheBundleError(tr("refused: {rel} cannot be written in the cache: {path} is a link or not a "
                                  "folder/file as expected; nothing installed", rel=rel, path=target))


def _move_into_place(staging: Path, folder: Path, files: Mapping[str, Mapping]) -> tuple[int, int]:
    """Move verified files from staging into the cache; a file already there with the same hash stays.

    Every target is checked before the first move; a failed move puts back the files the earlier moves
    replaced, removes the ones they added and the folders made for them, then raises CacheBundleError.
    """
    moves, present = [], 0
    for rel, expected in files.items():
        _check_target(folder, rel)
        target = folder / rel
        if target.is_file() and target.stat().st_size == expected["bytes"] and _sha256(target) == expected["sha256"]:
            present += 1
        else:
            moves.append(rel)
    replaced = Path(tempfile.mkdtemp(prefix=".bundle-replaced-", dir=folder))
    done: list[tuple[Path, Path | None]] = []  # (target, where its previous file waits)
    made: list[Path] = []  # folders created for new files, parents first
    rel = None
    try:
        for rel in moves:
            target = folder / rel
            missing = [p for p in reversed(PurePosixPath(rel).parents) if str(p) != "."]
            for part in missing:
                path = folder / part
                if not path.exists():
                    path.mkdir()
                    made.append(path)
            old = None
            if target.exists():
                old = replaced / rel
                old.parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, old)
            done.append((target, old))
            os.replace(staging / rel, target)
    except OSError as exc:
        for target, old in reversed(done):
            try:
                if old is not None:
                    os.replace(old, target)
                else:
                    target.unlink(missing_ok=True)
            except OSError as undo:
                log.warning("cache bundle: could not restore %s: %s", target, undo)
        for path in reversed(made):
            try:
                path.rmdir()
            except OSError:
                pass
        raise CacheBundleError(tr("could not move {rel} into the cache ({error}); the files already moved were put "
                                  "back", rel=rel, error=exc.strerror or type(exc).__name__)) from None
    finally:
        shutil.rmtree(replaced, ignore_errors=True)
    return len(moves), present
