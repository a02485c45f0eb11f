"""Compile-cache bundles: export/install round trip, per-field mismatch report, refusal of bad archives,
and the origin pin: a bundle is code, installed only when the archive's sha256 is the pinned one."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from support.app import app_backend, app_parts, app_settings

from neuron_backend.errors import CacheBundleError, ConfigError
from neuron_backend.runtime import Backend
from tools.cache import bundle, manifest, warm_start
from tools.cache.__main__ import main as cache_cli

ROOT = Path(__file__).resolve().parents[2]
# Text-to-image only: the manifest's shapes are the one size and the two buckets.
ARGS = ["--models", "tiny", "--device", "cpu", "--sizes", "64x64", "--chat-buckets", "32,64", "--references", "0"]
FAKE_CACHE = {"neff/MODULE_1/model.neff": b"\x01neff" * 100, "inductor/fxgraph/ab/entry": b"graph",
              "inductor/aotautograd/cd/entry": b"aot"}


def backend_at(root: Path, *extra: str) -> Backend:
    return app_backend(app_settings([*ARGS, "--cache-dir", str(root), *extra]))


def manifest_at(root: Path) -> dict:
    """This server's manifest at ``root`` once its weights are found (fingerprints need the folders)."""
    backend = backend_at(root)
    for step in backend.runner._steps:
        if step.task.kind == "weights":
            backend.runner._run_step(step)
    return warm_start.of(backend).here()


def pin(path: Path) -> str:
    """The sha256 of a whole archive: what --cache-bundle-sha256 pins."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def exported(tmp_path):
    """A warmed-up cache root with a few cache files, its live manifest, and its bundle."""
    source = tmp_path / "source"
    backend = backend_at(source)
    backend.runner.run()
    for rel, data in FAKE_CACHE.items():
        path = source / "compile-cache" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    warm_start.of(backend).record()
    out = tmp_path / "bundle.tar.gz"
    assert cache_cli(["export", str(out), "--cache-dir", str(source)]) == 0
    return source, out


@pytest.mark.slow
def test_export_then_install_into_a_fresh_root(tmp_path, exported, capsys):
    source, out = exported
    with tarfile.open(out) as tar:
        described, members = bundle.read_manifest(tar)
    assert set(FAKE_CACHE) <= set(described["files"]) and set(members) == set(described["files"])
    assert described["engines"]["chat"]["shapes"] == ["prefill-32", "prefill-64"]
    assert described["engines"]["image"]["shapes"] == ["64x64"]
    assert described["files"]["neff/MODULE_1/model.neff"]["bytes"] == 500
    assert described["software"]["torch"] and described["device"]["machine"]

    fresh = tmp_path / "fresh"
    backend = backend_at(fresh, "--cache-bundle", str(out), "--cache-bundle-sha256", pin(out))
    first_load = next(i for i, t in enumerate(backend.runner.tasks) if t.kind == "load")
    assert [t.kind for t in backend.runner.tasks[:first_load]] == ["weights", "weights", "bundle"]
    backend.runner.run()
    status = backend.status()
    task = next(t for t in status["tasks"] if t["kind"] == "bundle")
    assert task["state"] == "ready", task
    assert task["detail"].startswith("3 of 3 graphs usable")
    assert status["bundle"]["usable_graphs"] == 3 and status["bundle"]["mismatches"] == []
    assert all(t["from_bundle"] for t in status["tasks"] if t["kind"] == "compile")
    installed = files_under(fresh / "compile-cache")
    for rel, data in FAKE_CACHE.items():
        assert installed[rel] == data
    assert not [p for p in (fresh / "compile-cache").iterdir() if p.name.startswith(".bundle-")]

    assert cache_cli(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "chat: demo Qwen3" in shown and shown.startswith(f"sha256 {pin(out)}\n")


def test_mismatches_are_listed_by_field(exported):
    _, out = exported
    with tarfile.open(out) as tar:
        theirs, _ = bundle.read_manifest(tar)
    here = copy.deepcopy(theirs)
    here["software"]["torch"] = "2.14.0"
    usable, mismatches, total = manifest.compare(theirs, here)
    assert usable == {} and total == 3
    assert f"torch 2.14.0 here, {theirs['software']['torch']} in the bundle" in mismatches

    here = copy.deepcopy(theirs)
    here["engines"]["chat"]["context_length"] = 512  # every chat graph depends on the cache length
    here["engines"]["image"]["shapes"] = ["64x64", "96x64"]  # a size the bundle lacks: compiled here later
    usable, mismatches, _ = manifest.compare(theirs, here)
    assert usable == {"image": ["64x64"]}
    assert mismatches == [f"chat context_length: 512 here, {theirs['engines']['chat']['context_length']} in the bundle"]

    here = copy.deepcopy(theirs)
    here["engines"]["chat"]["shapes"] = ["prefill-32"]
    del here["engines"]["image"]
    usable, mismatches, _ = manifest.compare(theirs, here)
    assert usable == {"chat": ["prefill-32"]}
    assert "chat shapes prefill-64: in the bundle, not declared here" in mismatches
    assert "image engine: not enabled here (1 graphs unused)" in mismatches


@pytest.mark.slow
def test_a_bundle_that_fits_nothing_installs_nothing(tmp_path, exported, monkeypatch):
    _, out = exported
    fresh = tmp_path / "other-torch"
    backend = backend_at(fresh, "--cache-bundle", str(out), "--cache-bundle-sha256", pin(out))
    real = manifest.software
    monkeypatch.setattr(manifest, "software", lambda: dict(real(), torch="2.14.0"))
    backend.runner.run()
    task = next(t for t in backend.status()["tasks"] if t["kind"] == "bundle")
    assert task["state"] == "failed"
    assert "0 of 3 graphs usable" in task["error"] and "torch 2.14.0 here" in task["error"]
    assert not any((fresh / "compile-cache" / rel).exists() for rel in FAKE_CACHE)
    assert all(t["state"] == "ready" for t in backend.status()["tasks"] if t["kind"] != "bundle")  # served cold


def _rewrite(out: Path, target: Path, change) -> Path:
    """A copy of the bundle with ``change(members)`` applied to its (name, TarInfo, bytes) list."""
    with tarfile.open(out) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]
    members = change(members)
    with tarfile.open(target, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return target


def _tamper_file(members):
    return [(i, data + b"x" if i.name == "files/neff/MODULE_1/model.neff" else data) for i, data in members]


def _tamper_manifest(members):
    out = []
    for info, data in members:
        if info.name == "manifest.json":
            described = json.loads(data)
            described["files"]["inductor/fxgraph/ab/entry"]["sha256"] = "0" * 64
            data = json.dumps(described).encode()
        out.append((info, data))
    return out


def _escape(members):
    evil = tarfile.TarInfo("files/../../escaped.txt")
    return [*members, (evil, b"owned")]


def _absolute(members):
    return [*members, (tarfile.TarInfo("/tmp/absolute-evil.txt"), b"owned")]


def _symlink(members):
    link = tarfile.TarInfo("files/neff/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return [*members, (link, b"")]


def _unlisted(members):
    return [*members, (tarfile.TarInfo("files/neff/unlisted.neff"), b"not in the manifest")]


def _no_manifest(members):
    return [(i, d) for i, d in members if i.name != "manifest.json"]


def _sparse(members):
    """A listed file turned into a GNU sparse member (PAX form): its holes would be written as zeros."""
    out = []
    for info, data in members:
        if info.name == "files/neff/MODULE_1/model.neff":
            info.pax_headers = {"GNU.sparse.size": str(len(data)), "GNU.sparse.map": f"0,{len(data)}"}
        out.append((info, data))
    return out


def _gnu_sparse(members):
    """A listed file turned into an old-GNU sparse member (type byte ``S``): tarfile reads holes as zeros."""
    out = []
    for info, data in members:
        if info.name == "files/neff/MODULE_1/model.neff":
            info.type = tarfile.GNUTYPE_SPARSE
        out.append((info, data))
    return out


def _listed(*files: tuple[str, bytes]):
    """A change that adds ``files`` (cache-relative path, bytes) to the archive and to its manifest."""

    def change(members):
        out = []
        for info, data in members:
            if info.name == "manifest.json":
                described = json.loads(data)
                for rel, content in files:
                    described["files"][rel] = {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
                data = json.dumps(described).encode()
            out.append((info, data))
        return [*out, *((tarfile.TarInfo(f"files/{rel}"), content) for rel, content in files)]

    return change


@pytest.mark.slow
@pytest.mark.parametrize("change, reason", [
    (_tamper_file, "sha256|bytes"), (_tamper_manifest, "sha256"), (_escape, "outside files/"),
    (_absolute, "outside files/"), (_symlink, "not a regular file"), (_unlisted, "disagree"),
    (_no_manifest, "no manifest.json"), (_sparse, "sparse file"), (_gnu_sparse, "sparse file"),
    (_listed(("manifest.json", b"{}")), "never carries"), (_listed((".bundle-x/entry", b"e")), "never carries"),
    (_listed(("neff/x", b"file"), ("neff/x/y", b"under")), "neff/x is both a file and a folder"),
    (_listed(("neff/x/y", b"under"), ("neff/x", b"file")), "neff/x is both a file and a folder"),
])
def test_bad_archives_are_refused_whole(tmp_path, exported, change, reason):
    _, out = exported
    bad = _rewrite(out, tmp_path / "bad.tar.gz", change)
    fresh = tmp_path / "fresh"
    here = manifest_at(fresh)
    before = files_under(fresh / "compile-cache")
    with pytest.raises(CacheBundleError, match=reason):
        bundle.install(str(bad), here, fresh, pin(bad))
    assert files_under(fresh / "compile-cache") == before  # nothing written, no staging folder left
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute-evil.txt").exists()


def test_oversize_and_odd_sources_are_refused(tmp_path, exported, monkeypatch):
    _, out = exported
    here = manifest_at(tmp_path / "fresh")
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", 100)
    with pytest.raises(CacheBundleError, match="add up to more than 100 bytes"):
        bundle.install(str(out), here, tmp_path / "fresh", pin(out))
    (tmp_path / "garbage.tar.gz").write_bytes(b"not a tar at all")
    with pytest.raises(CacheBundleError, match="not a readable tar archive"):
        bundle.install(str(tmp_path / "garbage.tar.gz"), here, tmp_path / "fresh", pin(tmp_path / "garbage.tar.gz"))
    with pytest.raises(CacheBundleError, match="does not exist"):
        bundle.resolve_source(str(tmp_path / "missing.tar.gz"))
    with pytest.raises(CacheBundleError, match="cannot fetch the bundle hf://"):  # HF_HUB_OFFLINE=1 in tests
        bundle.resolve_source("hf://someone/some-cache@main")
    folder = tmp_path / "bundles"
    folder.mkdir()
    (folder / "a.tar.gz").write_bytes(out.read_bytes())
    assert bundle.resolve_source(str(folder)) == folder / "a.tar.gz"


def test_export_needs_a_manifest(tmp_path, capsys):
    assert cache_cli(["export", str(tmp_path / "x.tar.gz"), "--cache-dir", str(tmp_path / "empty")]) == 2
    assert "let warm-up finish" in capsys.readouterr().err


# ----- the origin pin: a bundle is code ----------------------------------------------------------------
class _Payload:
    """What a crafted inductor cache entry unpickles to: code that leaves a marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _crafted(out: Path, target: Path, marker: Path) -> Path:
    """The bundle with its FX-graph entry replaced by a malicious pickle and the manifest made to agree."""
    evil = pickle.dumps(_Payload(marker))

    def change(members):
        changed = []
        for info, data in members:
            if info.name == "files/inductor/fxgraph/ab/entry":
                data = evil
            elif info.name == "manifest.json":
                described = json.loads(data)
                described["files"]["inductor/fxgraph/ab/entry"] = {"sha256": hashlib.sha256(evil).hexdigest(),
                                                                   "bytes": len(evil)}
                data = json.dumps(described).encode()
            changed.append((info, data))
        return changed

    return _rewrite(out, target, change)


def _look_up_graphs(root: Path) -> None:
    """What inductor does when warm-up looks a graph up: unpickle the cache entries it finds."""
    for path in sorted((root / "compile-cache" / "inductor").rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                try:
                    pickle.load(f)
                except Exception:  # noqa: BLE001 - an entry that is no pickle is skipped, as inductor does
                    pass


def test_export_and_show_print_the_archive_sha256(tmp_path, exported, capsys):
    source, out = exported
    again = tmp_path / "again.tar.gz"
    assert cache_cli(["export", str(again), "--cache-dir", str(source)]) == 0
    assert f"sha256 {pin(again)}" in capsys.readouterr().out
    assert cache_cli(["show", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"sha256 {pin(out)}\n")


def test_an_unpinned_bundle_is_refused_before_staging_with_the_fix(tmp_path, exported, monkeypatch):
    _, out = exported
    with pytest.raises(ConfigError) as info:  # the app does not start
        backend_at(tmp_path / "fresh", "--cache-bundle", str(out))
    said = str(info.value)
    assert info.value.flag == "--cache-bundle" and "a bundle is code" in said
    assert "--cache-bundle-sha256 <sha256 of the archive>" in said and "tools.cache show PATH" in said
    with pytest.raises(ConfigError, match="not a sha256"):
        backend_at(tmp_path / "fresh", "--cache-bundle", str(out), "--cache-bundle-sha256", "abc")
    with pytest.raises(ConfigError, match="a bundle is code"):
        app_parts(app_settings([*ARGS, "--cache-dir", str(tmp_path / "fresh")],
                               env={"SHOWCASE_CACHE_BUNDLE": str(out)}))

    # install itself, without a pin: refused before the source is fetched, opened or staged
    here = manifest_at(tmp_path / "fresh")
    before = sorted((tmp_path / "fresh").rglob("*"))
    monkeypatch.setattr(bundle, "resolve_source", lambda *a, **k: pytest.fail("fetched an unpinned bundle"))
    monkeypatch.setattr(bundle.tarfile, "open", lambda *a, **k: pytest.fail("opened an unpinned bundle"))
    for source in (str(out), "hf://someone/some-cache@main"):
        for sha in (None, "", "not-a-sha"):
            with pytest.raises(CacheBundleError, match="a bundle is code.*--cache-bundle-sha256"):
                bundle.install(source, here, tmp_path / "fresh", sha)
    assert sorted((tmp_path / "fresh").rglob("*")) == before  # no folder made, nothing staged


@pytest.mark.slow
def test_a_wrong_pin_is_refused_and_the_cache_is_unchanged(tmp_path, exported):
    _, out = exported
    fresh = tmp_path / "fresh"
    kept = fresh / "compile-cache" / "neff" / "MODULE_1" / "model.neff"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"the neff this host compiled")
    before = files_under(fresh / "compile-cache")
    backend = backend_at(fresh, "--cache-bundle", str(out), "--cache-bundle-sha256", "0" * 64)
    backend.runner.run()
    task = next(t for t in backend.status()["tasks"] if t["kind"] == "bundle")
    assert task["state"] == "failed"
    assert f"has sha256 {pin(out)}, not the pinned {'0' * 64}" in task["error"]
    assert files_under(fresh / "compile-cache") == before
    assert not [p for p in (fresh / "compile-cache").iterdir() if p.name.startswith(".bundle-")]
    assert all(t["state"] == "ready" for t in backend.status()["tasks"] if t["kind"] != "bundle")  # served cold


@pytest.mark.slow
def test_a_crafted_pickle_never_runs_unless_its_archive_is_pinned(tmp_path, exported):
    _, out = exported
    marker = tmp_path / "payload-ran"
    evil = _crafted(out, tmp_path / "evil.tar.gz", marker)
    with tarfile.open(evil) as tar:
        bundle.read_manifest(tar)  # consistent: every check of the archive itself passes
    entry = Path("compile-cache/inductor/fxgraph/ab/entry")
    for name, pinned in (("unpinned", None), ("wrong-pin", pin(out))):  # pinned to the honest export
        root = tmp_path / name
        extra = ["--cache-bundle-sha256", pinned] if pinned else []
        try:
            backend = backend_at(root, "--cache-bundle", str(evil), *extra)
        except ConfigError:
            backend = None
        if backend is not None:
            backend.runner.run()
        try:
            bundle.install(str(evil), manifest_at(root), root, pinned)
        except CacheBundleError:
            pass
        _look_up_graphs(root)
        assert not marker.exists(), f"{name}: the crafted pickle ran"
        assert not (root / entry).exists(), name

    # the right pin is the operator's word that this archive is trusted: it installs as any bundle does
    root = tmp_path / "pinned"
    report = bundle.install(str(evil), manifest_at(root), root, pin(evil))
    assert report.usable_graphs == 3 and (root / entry).read_bytes() == pickle.dumps(_Payload(marker))
    assert not marker.exists()  # installing unpickles nothing


def test_space_is_checked_before_staging(tmp_path, exported, monkeypatch):
    _, out = exported
    fresh = tmp_path / "fresh"
    here = manifest_at(fresh)
    before = sorted(fresh.rglob("*"))
    monkeypatch.setattr(bundle, "_free_bytes", lambda folder: 1000)
    with pytest.raises(CacheBundleError, match="bytes free"):
        bundle.install(str(out), here, fresh, pin(out))
    assert sorted(fresh.rglob("*")) == before  # nothing staged


def test_a_failed_move_puts_the_cache_back(tmp_path, exported, monkeypatch):
    _, out = exported
    fresh = tmp_path / "fresh"
    here = manifest_at(fresh)
    old = fresh / "compile-cache" / "inductor" / "fxgraph" / "ab" / "entry"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an older graph")
    before = files_under(fresh / "compile-cache")
    real, moved = os.replace, []

    def replace(src, dst):
        if ".bundle-" in str(src) and "replaced" not in str(src) and moved:
            raise OSError(28, "No space left on device")
        if ".bundle-" in str(src) and "replaced" not in str(src):
            moved.append(dst)
        real(src, dst)

    monkeypatch.setattr(bundle.os, "replace", replace)
    with pytest.raises(CacheBundleError, match="put back"):
        bundle.install(str(out), here, fresh, pin(out))
    monkeypatch.undo()
    assert moved and files_under(fresh / "compile-cache") == before
    assert sorted(p.name for p in (fresh / "compile-cache").iterdir()) == ["inductor"]


def test_every_target_is_checked_before_the_first_move(tmp_path, exported):
    _, out = exported
    fresh = tmp_path / "fresh"
    here = manifest_at(fresh)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (fresh / "compile-cache").mkdir(parents=True, exist_ok=True)
    (fresh / "compile-cache" / "inductor").symlink_to(elsewhere, target_is_directory=True)
    before = files_under(fresh / "compile-cache")
    with pytest.raises(CacheBundleError, match="is a link or not a folder"):
        bundle.install(str(out), here, fresh, pin(out))
    assert files_under(fresh / "compile-cache") == before and not list(elsewhere.iterdir())

def test_readiness_warns_about_a_failed_bundle_but_not_about_failed_shapes():
    from neuron_backend.metrics import readiness
    from neuron_backend.warmup import Task

    cache = Task("compile cache · install bundle", "cache", "bundle", state="failed")
    shapes = [Task("chat · 32 tokens", "chat", "compile", "32", state="ready"),
              Task("image · 64x64", "image", "compile", "64x64", state="ready")]
    ready, body = readiness([cache, *shapes])
    assert ready and body["ready"] is True and body["failed"] == [] and body["warming"] == []
    assert len(body["warnings"]) == 1 and body["warnings"][0].startswith("compile cache · install bundle: failed")
    shapes[1].state = "failed"  # an engine that does not serve a declared shape is still not ready
    ready, body = readiness([cache, *shapes])
    assert not ready and body["failed"] == ["image · 64x64"] and len(body["warnings"]) == 1
    cache.state, shapes[1].state = "running", "queued"  # and nothing is ready while the bundle installs
    assert readiness([cache, *shapes])[0] is False
    cache.state, shapes[1].state = "ready", "ready"
    assert readiness([cache, *shapes]) == (True, {"ready": True, "done": 3, "total": 3, "warming": [],
                                                   "failed": [], "warnings": []})


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["corrupt archive", "made for other software"])
def test_a_bundle_that_fails_to_install_leaves_readyz_ready_with_a_warning(tmp_path, request, monkeypatch, problem):
    import httpx
    from support.app import start_app

    if problem == "corrupt archive":
        source = tmp_path / "corrupt.tar.gz"
        source.write_bytes(b"\x1f\x8b not really gzip")
    else:
        _, source = request.getfixturevalue("exported")
        real = manifest.software
        monkeypatch.setattr(manifest, "software", lambda: dict(real(), torch="2.14.0"))
    demo, backend, url = start_app(tmp_path / "root", "--cache-bundle", str(source),
                                   "--cache-bundle-sha256", pin(source))
    try:
        assert url.startswith("http://127.0.0.1:")
        tasks = backend.status()["tasks"]
        assert next(t for t in tasks if t["kind"] == "bundle")["state"] == "failed"
        assert all(t["state"] == "ready" for t in tasks if t["kind"] != "bundle")  # both engines serve
        answer = httpx.get(url + "readyz", timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["ready"] is True and body["failed"] == []
        assert len(body["warnings"]) == 1 and "install bundle: failed" in body["warnings"][0]
        assert str(tmp_path) not in answer.text  # no paths in the probe's body
    finally:
        demo.close()


WARM_START = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from neuron_backend.chat.text import ChatRequest
    from app import PLUGINS
    from neuron_backend.plugins import plug_all
    from neuron_backend.runtime import Backend
    from neuron_backend.settings import parse_settings
    from tools.cache import warm_start
    extra = sys.argv[2:]
    s = parse_settings(["--models", "tiny", "--device", "cpu", "--compile", "on", "--no-image",
                        "--chat-buckets", "32,64", "--context-length", "96", "--cache-dir", sys.argv[1], *extra],
                       env={}, plugins=PLUGINS)
    backend = Backend(s, parts=plug_all(PLUGINS, s))
    backend.runner.run()
    warm_start.of(backend).record()
    graphs = [list(backend.stream_chat(ChatRequest(message="demo " * n, max_new_tokens=3, greedy=True)))[-1]
              .stats.compiled_graphs for n in (1, 4)]
    snap = backend.status()
    print(json.dumps({"tasks": snap["tasks"], "graphs": graphs, "since_ready": snap["compiles_since_ready"]}))
""")


@pytest.mark.slow
def test_a_fresh_root_from_a_bundle_starts_warm_and_never_compiles_after(tmp_path):
    def start(root, *extra):
        out = subprocess.run([sys.executable, "-c", WARM_START, str(root), *extra], capture_output=True, text=True,
                             timeout=900, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = start(tmp_path / "cold")
    assert cache_cli(["export", str(tmp_path / "b.tar.gz"), "--cache-dir", str(tmp_path / "cold")]) == 0
    fresh = start(tmp_path / "fresh", "--cache-bundle", str(tmp_path / "b.tar.gz"),
                  "--cache-bundle-sha256", pin(tmp_path / "b.tar.gz"))
    compiles = lambda run: [t for t in run["tasks"] if t["kind"] == "compile"]  # noqa: E731
    assert [t["cache_hit"] for t in compiles(cold)][0] is False
    assert [t["cache_hit"] for t in compiles(fresh)][0] is True
    assert all(t["from_bundle"] for t in compiles(fresh))
    assert next(t for t in fresh["tasks"] if t["kind"] == "bundle")["state"] == "ready"
    assert fresh["graphs"] == [0, 0] and fresh["since_ready"] == 0


def test_the_manifest_records_the_commit_loaded_without_refusing_another(tmp_path, demo_models, hf_cache):
    from support.model_folders import add_to_cache

    old_commit = "fedcba9876543210fedcba9876543210fedcba98"
    add_to_cache(hf_cache, "test-org/chat", demo_models.chat, commit=old_commit)
    backend = app_backend(app_settings([*ARGS[2:], "--models", "full", "--no-image", "--cache-dir", str(tmp_path),
                                        "--chat-model", f"test-org/chat@{old_commit}"]))
    for step in backend.runner._steps:
        if step.task.kind == "weights":
            backend.runner._run_step(step)
    here = warm_start.of(backend).here()
    assert here["engines"]["chat"]["model"] == "test-org/chat"
    assert here["engines"]["chat"]["revision"] == old_commit
    # Graphs depend on the fingerprint, not on the weights' values: a bundle of another commit still fits.
    theirs = copy.deepcopy(here)
    theirs["engines"]["chat"]["revision"] = "0" * 40
    usable, mismatches, _ = manifest.compare(theirs, here)
    assert usable == {"chat": here["engines"]["chat"]["shapes"]} and mismatches == []
